"""Where a dataset is stored: the ``Location`` interface and its table of schemes, local files, HTTP(S),
object stores, the one resumable ranged stream, the shard cache and read-ahead on slow storage."""
