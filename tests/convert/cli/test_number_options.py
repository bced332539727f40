"""Number options of the measuring commands refuse NaN, infinities and meaningless bounds before
any work, naming the option (``--compute-ms inf`` ended in an OverflowError traceback,
``--compute-ms nan`` in "Invalid value NaN" naming nothing, ``--min-speedup nan`` made every run
pass, ``--budget-s nan`` ran a sweep with no budget)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from shardfeed.convert.cli import main


@pytest.mark.parametrize("args,option", [
    (["bench", "X", "--compute-ms", "inf"], "--compute-ms"),
    (["bench", "X", "--compute-ms", "nan"], "--compute-ms"),
    (["verify", "X", "Y", "--min-speedup", "nan"], "--min-speedup"),
    (["verify", "X", "Y", "--min-speedup", "-1"], "--min-speedup"),
    (["verify", "X", "Y", "--min-speedup", "0"], "--min-speedup"),
    (["verify", "X", "Y", "--min-speedup", "inf"], "--min-speedup"),
    (["tune", "X", "--budget-s", "nan"], "--budget-s"),
    (["tune", "X", "--budget-s", "inf"], "--budget-s"),
])
def test_non_finite_or_meaningless_numbers_are_usage_errors(args, option, tmp_path):
    r = CliRunner().invoke(main, [a.replace("X", str(tmp_path / "x")).replace("Y", str(tmp_path / "y"))
                                  for a in args])
    assert r.exit_code == 2, r.output
    assert option in r.output and "Traceback" not in r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)


def test_finite_values_still_parse():
    from shardfeed.convert.cli.common import FiniteFloat

    assert FiniteFloat(min=0).convert("2.5", None, None) == 2.5
    assert FiniteFloat(min=0, min_open=True).convert("0.1", None, None) == 0.1
