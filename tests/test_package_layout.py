"""The package stays readable module by module: none is over 400 lines."""

import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "coevo_jax"
MAX_LINES = 400


def test_no_module_is_over_400_lines():
    long = {
        str(path.relative_to(PACKAGE)): n
        for path in PACKAGE.rglob("*.py")
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"split these modules (lines): {long}"
