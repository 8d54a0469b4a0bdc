"""The project's top-level modules are the ones imported, whatever else the environment installs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_a_foreign_kernels_module_first_on_the_path_is_one_error_by_name(tmp_path):
    # Hugging Face's `kernels` (a dependency of transformers >= 5.25) installs a top-level module of our name
    foreign = tmp_path / "kernels"
    foreign.mkdir()
    (foreign / "__init__.py").write_text("from huggingface_hub import hf_hub_download\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    run = subprocess.run([sys.executable, "-c", "import workbench.tune"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: the module 'kernels' resolves to ")
    assert str(foreign) in last and str(ROOT / "kernels") in last and "transformers<5.25" in last


def test_this_projects_kernels_imports_from_any_directory(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", "import workbench, kernels; print(kernels.__file__)"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert Path(run.stdout.strip()) == ROOT / "kernels" / "__init__.py"


def test_the_private_names_contract_finds_a_private_name_on_any_line_of_an_import(tmp_path, monkeypatch):
    """lint-imports (scripts/test.sh) checks the project with this contract (pyproject.toml); here it is shown a
    package that breaks the rule where grimp's first line of the statement does not show it."""
    import grimp

    from scripts.importlint_private_names import PrivateNamesContract

    pkg = tmp_path / "privnames_fixture"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("__version__ = '1'\n")
    (pkg / "_impl.py").write_text("VALUE = 1\n_HIDDEN = 2\n")
    (pkg / "a.py").write_text("from privnames_fixture._impl import VALUE  # a private module's public name: fine\n"
                              "from privnames_fixture import __version__  # a dunder: fine\n")
    (pkg / "b.py").write_text("from privnames_fixture._impl import (VALUE,\n"
                              "                                     _HIDDEN)\n"
                              "def f():\n    from . import _impl\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    contract = PrivateNamesContract(name="private names", session_options={}, contract_options={})
    check = contract.check(grimp.build_graph("privnames_fixture", cache_dir=None), verbose=False)
    assert not check.kept
    assert sorted((f["importer"], f["line"], f["name"]) for f in check.metadata["imports"]) == [
        ("privnames_fixture.b", 1, "_HIDDEN"), ("privnames_fixture.b", 4, "_impl")]
