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


def test_no_module_imports_another_modules_private_name():
    """A name one module imports from another is public (no leading underscore): what is shared inside a package
    says so by its name, and an underscore name stays with the module that defines it (issue 42)."""
    import ast

    packages = ("workbench", "loaders", "kernels", "reports")
    found = []
    for top in packages:
        for path in sorted((ROOT / top).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.ImportFrom):
                    continue
                ours = node.level > 0 or (node.module or "").split(".")[0] in packages
                for alias in node.names:
                    if ours and alias.name.startswith("_") and not alias.name.startswith("__"):
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {alias.name} from "
                                     f"{'.' * node.level}{node.module or ''}")
    assert not found, "private names imported across modules:\n" + "\n".join(found)
