# shardfeed — one command each for set-up, demo, tests and benchmarks.
# Every target installs what it needs first (a virtual environment in .venv).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# the peers that cannot share .venv (scripts/bench_peers.py --peer-python)
PEERS_VENV ?= .venv-peers
SHARDFEED := $(VENV)/bin/shardfeed
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo
# torch: an existing CPU build is kept; without a GPU a CPU build is installed (no multi-GB CUDA
# download); with a GPU (nvidia-smi present) the default build. Override: make install TORCH_SPEC=...
TORCH_SPEC ?=
DEMO_DATA := data/sample
DEMO_OUT := out/demo
PYTEST_ARGS ?=

.PHONY: help install install-demo demo test test-fast bench lint docs docs-serve clean distclean system-deps system-deps-demo gpu-check mutants

# A bare `make` lists the targets.
.DEFAULT_GOAL := help
help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:[^#]*## /\t/' | awk -F'\t' '{printf "  make %-13s %s\n", $$1, $$2}'

$(PY):
	$(PYTHON) -m venv $(VENV)

# Two stamps: the demo's (the package, torch, OpenCV and the storage emulator's mfusepy: about
# 1.1 GB) and the full one on top of it (the test, docs and interop tools, Ray, Lightning and
# transformers: about 3.5 GB in all) that test, lint, docs and bench need.
$(DEMO_STAMP): pyproject.toml scripts/install_torch.sh | $(PY)
	TORCH_SPEC="$(TORCH_SPEC)" sh scripts/install_torch.sh $(PY)
	$(PY) -m pip install -q -e ".[opencv,demo]"
	touch $(DEMO_STAMP)

$(STAMP): $(DEMO_STAMP)
	$(PY) -m pip install -q -e ".[dev,docs,opencv,demo,ray,interop,lightning,transformers]"
	touch $(STAMP)

install-demo: $(DEMO_STAMP)  ## create .venv with what make demo runs: shardfeed (editable), torch, OpenCV, mfusepy

install: $(STAMP)  ## install-demo plus the test and docs tools, Ray, Lightning, transformers and the interop readers (DALI, wids, datasets)

# nginx (HTTP Range requests), openssl (TLS test certificate), fuse3 + libfuse2 (the storage
# emulator), chromium (the HTML report and docs site tests): scripts/system_deps.sh installs them with apt-get
# when we are root on Debian; under CI it fails when it cannot. The demo needs only fuse3 + libfuse2.
system-deps:  ## the Debian packages the tests use (apt-get, only when root): nginx, openssl, fuse3, libfuse2, chromium
	@sh scripts/system_deps.sh

system-deps-demo:
	@sh scripts/system_deps.sh demo

# verify runs the same loop over the folder and the shards; --compute-ms 20 stands in for a GPU
# step that leaves the CPU to the loader, --cold reads from the disk rather than the page cache,
# --threads 1 keeps the main process's torch threads off the loader workers' cores. The cold runs
# measure one whole epoch from its first batch (46 x 64 of the 3,000 images, --warmup 0): a shard
# reader reads ahead, and a warm-up would take in the whole 40 MB before the measured window.
# Then the same verify over emulated network storage (a FUSE mount adding 2 ms per open and per
# read request, scripts/storage_emulator.py) where FUSE works; where not, one line says why.
demo: install-demo system-deps-demo  ## build the sample folder, pack it, verify before vs after (local disk, then emulated network storage)
	$(PY) scripts/make_sample_data.py $(DEMO_DATA)
	$(SHARDFEED) pack $(DEMO_DATA) $(DEMO_OUT)/wds --format wds --max-count 500 --overwrite
	$(SHARDFEED) pack $(DEMO_DATA) $(DEMO_OUT)/lmdb --format lmdb --overwrite
	$(SHARDFEED) inspect $(DEMO_OUT)/wds
	$(SHARDFEED) verify $(DEMO_DATA) $(DEMO_OUT)/wds --compute-ms 20 --cold --repeats 3 --threads 1 \
	  --image-size 64 --batch-size 64 --batches 46 --warmup 0 --json $(DEMO_OUT)/verify.json
	$(PY) scripts/demo_network.py $(DEMO_DATA) $(DEMO_OUT)/wds --latency-ms 2 \
	  --local-json $(DEMO_OUT)/verify.json --json $(DEMO_OUT)/verify-network.json

# The Ray tests run in their own pytest process: Ray leaves gRPC threads behind, and forking
# DataLoader workers from a process with such threads is asking for a deadlock.
test: install system-deps  ## the whole suite (slow, multi-process and Ray tests included)
	$(PY) -P -m pytest -m ray $(PYTEST_ARGS)
	$(PY) -P -m pytest -m "not ray" $(PYTEST_ARGS)

test-fast: install  ## skip slow and multi-process tests
	$(PY) -P -m pytest -m "not slow and not multiprocess and not ray" $(PYTEST_ARGS)

bench: install system-deps  ## side-by-side benchmarks; prints ratios and writes out/bench/*.json
	$(PY) -m pip install -q -e ".[bench]"
	$(PY) scripts/bench.py --out out/bench
	$(PY) scripts/bench_jpeg_bindings.py --json out/bench/jpeg_bindings.json
	$(PY) scripts/bench_decode.py --json out/bench/decode.json
	$(PY) scripts/bench_reencode.py --out out/bench/reencode
	$(PY) scripts/bench_pack_scaling.py --json out/bench/pack_scaling.json
	$(PY) scripts/bench_resume.py --out out/bench/resume
	$(PY) scripts/bench_scale.py --json out/bench/scale.json
	$(PY) scripts/make_sample_data.py $(DEMO_DATA)
	$(PY) scripts/bench_ray.py --src $(DEMO_DATA) --json out/bench/ray.json
	$(PY) scripts/bench_s3.py --src $(DEMO_DATA) --out out/bench
	# verify folder vs WebDataset/LMDB on emulated network storage (FUSE) at 0, 0.5, 2, 10 ms
	$(PY) scripts/bench_storage.py --src $(DEMO_DATA) --out out/bench/storage
	# loader CPU per image (evaluation crop, workers, small images), WebDataset read-ahead on slow storage
	$(PY) scripts/make_sample_data.py data/bench-imagenet --num-images 1600 --min-size 375 --max-size 500 --png-share 0
	$(PY) scripts/make_sample_data.py data/bench-small --num-images 2560 --min-size 64 --max-size 96 --png-share 0
	test -f data/bench-imagenet-wds/manifest.json || $(VENV)/bin/shardfeed pack data/bench-imagenet data/bench-imagenet-wds --format wds --max-count 256 --overwrite
	test -f data/bench-small-wds/manifest.json || $(VENV)/bin/shardfeed pack data/bench-small data/bench-small-wds --format wds --max-count 512 --overwrite
	$(PY) scripts/bench_overhead.py --imagenet data/bench-imagenet-wds --small data/bench-small-wds --json out/bench/overhead.json
	$(PY) scripts/bench_enlarge.py --json out/bench/enlarge.json
	$(PY) scripts/bench_readahead.py --wds data/bench-imagenet-wds --json out/bench/readahead.json
	# does watch name the planted bottleneck? confusion matrix and stall against the loop's own clock,
	# alone and with two CPU burners beside it
	$(PY) scripts/validate_watch.py --runs 5 --json out/bench/validate_watch.json
	$(PY) scripts/validate_watch.py --runs 5 --burners 2 --json out/bench/validate_watch_burners.json
	# other loaders on the same tasks, on local disk and on the storage emulator at 2 ms: webdataset and
	# DALI from .venv, the rest from $(PEERS_VENV); a peer that did not install is a row saying so
	$(MAKE) --no-print-directory $(PEERS_VENV)/.installed || echo "bench: $(PEERS_VENV) incomplete (reported in the peers table)"
	$(PY) scripts/bench_peers.py --folder data/bench-imagenet --wds data/bench-imagenet-wds --storage-ms 2 \
		--peer-python $(PEERS_VENV)/bin/python --json out/bench/peers.json --markdown out/bench/peers.md
	# the same on small images (64-96 px enlarged to 224), where per-sample overhead shows: local disk only
	$(PY) scripts/bench_peers.py --folder data/bench-small --wds data/bench-small-wds \
		--peer-python $(PEERS_VENV)/bin/python --json out/bench/peers-small.json --markdown out/bench/peers-small.md
	# its validation task in parts (decode, per-sample call, reader alone, loader), beside FFCV's decode and resize
	$(PY) scripts/bench_small_val.py --folder data/bench-small --wds data/bench-small-wds \
		--peer-python $(PEERS_VENV)/bin/python --json out/bench/small-val.json

# The peer loaders of scripts/bench_peers.py that cannot share .venv (a torch with its matching
# torchvision, FFCV's numba), each installed on its own so that one failure leaves the others;
# FFCV's build needs pkg-config, libopencv-dev and libturbojpeg0-dev (apt-get when root). The stamp
# is written only when every peer installed, so the next `make bench` tries the others again.
# ~6 GB: torch 2.14.1 from PyPI is a CUDA build (it runs on the CPU). On aarch64:
# make bench PEERS_TORCH="torch==2.9.1 torchvision==0.24.1"
PEERS_TORCH ?= torch==2.14.1 torchvision==0.29.1
$(PEERS_VENV)/.installed: scripts/install_peers.sh
	sh scripts/install_peers.sh $(PEERS_VENV) "$(PEERS_TORCH)"

# Mutation testing of the modules that carry the README's promises (scripts/mutants.toml lists them
# with their fast tests); not part of `make test` (it runs the tests once per mutant: long).
# MUTANTS_ARGS="--sample 40" tries a seeded sample per module; "--only readers/storage/http_io.py" one module.
MUTANTS_ARGS ?=
mutants: install  ## mutation testing (cosmic-ray); survivors in out/mutants/report.txt
	$(PY) -m pip install -q -e ".[mutants]"
	$(PY) scripts/mutants.py --out out/mutants $(MUTANTS_ARGS)

# On a machine with a CUDA GPU: the gpu-marked tests, then verify with resnet50 on generated
# ImageNet-sized data, folder vs WebDataset vs LMDB, warm and --cold (out/gpu-check/report.json).
# Without CUDA it says so in one line and exits 2. About 5 minutes on one data-centre GPU.
gpu-check: install  ## CUDA machines: gpu tests + verify --device cuda (resnet50); exits 2 without CUDA
	@$(PY) scripts/gpu_check.py --out out/gpu-check

# mypy checks the public surface ([tool.mypy] in pyproject.toml lists the modules and the budget
# of errors left under --strict; scripts/mypy_budget.py fails when the count grows).
lint: install  ## ruff (pyflakes + pycodestyle + bugbear rules) and mypy on the public API
	$(VENV)/bin/ruff check convert readers scripts tests
	$(PY) scripts/mypy_budget.py

# The documentation site (mkdocs.yml, docs/): --strict fails on a broken link or anchor.
DOCS_OUT ?= out/site
docs: install  ## build the documentation site into out/site (mkdocs --strict)
	$(PY) -m mkdocs build --strict --site-dir $(DOCS_OUT)

docs-serve: install  ## serve the documentation site on http://127.0.0.1:8000 with live reload
	$(PY) -m mkdocs serve --dev-addr 127.0.0.1:8000

clean:
	rm -rf out build dist *.egg-info .pytest_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) data
