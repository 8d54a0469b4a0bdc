"""``python -m workbench.tune``: search the knobs of a study, validate the best, export the winner.

The CLI of the ``Tuner`` (workbench.tune.tuner); it also builds the report (``reports``, the layer above the
tuner) and hands the tuner the memory tool's gradient-lifetime writer (``workbench.memory``, its sibling).
docs/tuner.md describes one run.

    python -m workbench.tune [--study NAME|PATH] [--trials N] [--timeout S] [--gpu-minutes M] [--storage URL]
                             [--study-name NAME] [--gpus N] [--out runs/] [--worker] [--no-report]
                             [--no-progress]
    python -m workbench.tune export [same flags]   # re-export runs/<study>/config.yaml from its result
    python -m workbench.tune report [same flags]   # rebuild runs/<study>/report.html
    python -m workbench.tune verify [same flags] [--pairs N]   # re-measure the export against the baseline
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy.exc

from workbench.errors import ConfigError, DiskError, TuneError
from workbench.files import check_name
from workbench.tune.export import export_config, winner_launch_record
from workbench.tune.storage import default_storage_url, make_storage, mask_url, normalize_storage_url
from workbench.tune.study import DEFAULT_STUDY, StudySpec, builtin_studies, load_study_spec, spec_from_dict
from workbench.vocab import TUNE_EXIT

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = (TUNE_EXIT[k] for k in ("ok", "error", "usage", "interrupted"))

# The tuner, its trial runner, the report's builder and the gradient-lifetime analysis import torch (a second and
# more): each command imports them where it starts, so an error in the arguments or the spec is told without it.


# --------------------------------------------------------------------------- CLI


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m workbench.tune", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", nargs="?", choices=("tune", "export", "report", "verify"), default="tune",
                   help="tune: run or resume the study; on an existing study: export writes config.yaml again "
                   "from its stored result, report rebuilds report.html, verify re-measures the exported config "
                   "interleaved with the baseline (exit 1 when the speedup does not hold) (default: %(default)s)")
    p.add_argument("--study", help=f"built-in study name, spec file, or the name of a study already under --out "
                   f"(default {DEFAULT_STUDY}; a worker without it reads the spec from the storage)")
    p.add_argument("--trials", type=int, help="trial budget (default: the spec's budget.trials)")
    p.add_argument("--timeout", type=float, help="wall-clock limit of the search in this process, seconds (default: the spec's budget.timeout_s)")
    p.add_argument("--gpu-minutes", type=float, help="device time of the whole study (baseline, search, validation, "
                   "traces), in GPU-minutes (default: the spec's budget.gpu_minutes)")
    p.add_argument("--storage", help="Optuna storage URL (default sqlite:///<out>/<study>/study.db)")
    p.add_argument("--seed", type=int, help="the sampler's seed (default: the spec's sampler.seed); another seed is "
                   "another search of the same space: name its study apart with --study-name")
    p.add_argument("--study-name", help="Optuna study name and runs/ directory (default: the spec's name)")
    p.add_argument("--gpus", type=int, help="GPUs per trial (default: the spec's gpus); more than 1 needs that many CUDA GPUs "
                   "(trials run under torchrun)")
    p.add_argument("--out", default="runs", help="directory of study outputs (default runs/)")
    p.add_argument("--worker", action="store_true", help="only run search trials of an existing or shared study")
    p.add_argument("--no-report", action="store_true", help="do not build report.html")
    p.add_argument("--no-reference", action="store_true", help="on a GPU study, do not measure the winner beside "
                   "the plain torch.compile loop after validation (A/B pairs as the validation's)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (one line per trial still)")
    p.add_argument("--pairs", type=int, help="verify: A/B pairs to run (default: as many as the validation took, "
                   "at least 3)")
    p.add_argument("--yes", action="store_true", help="run a study's own trainer.command without asking, when the "
                   "spec comes from a file outside the working directory or from the storage")
    p.add_argument("--reset", action="store_true", help="start the study over in place, deleting its trials and "
                   "measurements (asks first; --yes does not ask). A study with nothing measured yet starts over "
                   "without it when its spec changed")
    p.add_argument("--debug", action="store_true", help="on an error, print the traceback after its line")
    args = p.parse_args(argv)
    if args.reset and (args.worker or args.command != "tune"):
        p.error("--reset starts a study over: only the coordinator's tune command takes it")
    if args.pairs is not None and args.pairs < 2:
        p.error("--pairs must be >= 2")
    if args.trials is not None and args.trials < 1:
        p.error("--trials must be >= 1")
    if args.gpus is not None and args.gpus < 1:
        p.error("--gpus must be >= 1")
    if args.timeout is not None and args.timeout <= 0:
        p.error("--timeout must be > 0")
    if args.gpu_minutes is not None and not args.gpu_minutes > 0:
        p.error("--gpu-minutes must be > 0")
    if args.seed is not None and not 0 <= args.seed < 2**31:
        p.error("--seed must be in [0, 2**31)")
    if args.seed is not None and args.worker:
        p.error("--seed: a worker's sampler seed is derived from the study's (its own pid added); set it where the "
                "study starts")
    return args


def _resolve_spec(args: argparse.Namespace) -> StudySpec | None:
    if args.study is None and args.worker and args.study_name:
        return None  # read from the storage
    spec = load_study_spec(args.study or DEFAULT_STUDY)
    if args.gpus is not None and args.gpus != spec.gpus:
        try:
            spec = replace(spec, gpus=args.gpus)
        except ConfigError as e:
            raise ConfigError(f"--gpus {args.gpus}: study {spec.name!r} does not fit {args.gpus} processes per trial "
                              f"({e}); its global batch must split over them, or use a study made for several "
                              f"GPUs (gr00t-n1.6-2gpu, gr00t-n1.6-8gpu)") from None
    if args.seed is not None:
        spec = replace(spec, sampler=replace(spec.sampler, seed=args.seed))
    return spec


def _escaped(text: str) -> str:
    """``text`` with every non-printable character (CR, ESC, ...) written as its Python escape, so that what the
    terminal shows is what would run."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _confirm_command(yes: bool) -> Callable[[StudySpec], None]:
    """Show a spec's own trainer command before it runs, control characters escaped; without --yes, ask on a
    terminal, refuse elsewhere, and refuse a command holding a control character."""

    def confirm(spec: StudySpec) -> None:
        t = spec.trainer
        if t is None:
            return  # nothing of the spec's own runs
        parts = [shlex.join(t.command), f"cwd {t.cwd}", *(f"env {k}={shlex.quote(v)}" for k, v in t.env.items())]
        print(f"study {_escaped(spec.name)!r} from {_escaped(str(spec.source))} runs its own command in every "
              "trial:" + "".join(f"\n  {_escaped(p)}" for p in parts), file=sys.stderr, flush=True)
        if yes:
            return
        if any(_escaped(p) != p for p in parts):
            raise TuneError("this spec's trainer command holds control characters (shown escaped above), which "
                            "can hide part of it on a terminal; pass --yes to run it as it is")
        if not sys.stdin.isatty():
            raise TuneError("this spec's trainer.command did not come from a study file under the working directory; "
                            "read it above and pass --yes to run it")
        if input("Run it? [y/N] ").strip().lower() not in ("y", "yes"):
            raise TuneError("not confirmed: nothing was run")

    return confirm


def _confirm_reset(yes: bool) -> Callable[[str], None]:
    """--reset: ask before measurements are deleted (``question`` says which); --yes answers yes, no terminal no."""

    def confirm(question: str) -> None:
        if yes:
            return
        if not sys.stdin.isatty():
            raise TuneError(f"{question} Not on a terminal: pass --yes with --reset to confirm")
        if input(f"{question} [y/N] ").strip().lower() not in ("y", "yes"):
            raise TuneError("not confirmed: the study was left as it was")

    return confirm


def _resume_hint() -> str:
    """The command line again, with the password of a --storage URL masked (the user types it again)."""
    argv, shown = sys.argv[1:], []
    for i, a in enumerate(argv):
        if a.startswith("--storage="):
            a = "--storage=" + mask_url(a.split("=", 1)[1])
        elif i and argv[i - 1] == "--storage":
            a = mask_url(a)
        shown.append(a)
    return "python -m workbench.tune " + " ".join(shlex.quote(a) for a in shown)


def _raise_keyboard_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _stored_name(args: argparse.Namespace) -> str | None:
    """``--study NAME`` that is neither a built-in study nor a spec file but a study already under ``--out``
    (its folder holds its storage): that study's name, its spec read from the storage; else None."""
    name = args.study
    if not name or args.study_name or "/" in name or name.endswith((".yaml", ".yml")) or Path(name).exists():
        return None
    if name in builtin_studies():
        return None
    has_storage = args.storage is not None or (Path(args.out) / name / "study.db").exists()
    return name if has_storage else None


def _existing(args: argparse.Namespace) -> tuple[StudySpec, str, Path, str]:
    """Spec, study name, study dir and storage URL of an existing study (export/report/verify)."""
    stored_name = _stored_name(args)
    spec = None if stored_name else _resolve_spec(args)
    name = args.study_name or stored_name or (spec.name if spec else None)
    if name is None:
        raise TuneError("give --study or --study-name")
    check_name(name, "--study-name")
    study_dir = Path(args.out).resolve() / name
    url = normalize_storage_url(args.storage or default_storage_url(study_dir))
    if args.storage is None and not (study_dir / "study.db").exists():
        raise TuneError(f"no study at {study_dir / 'study.db'}; run `python -m workbench.tune` first")
    storage = make_storage(url)
    try:
        study = optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        raise TuneError(f"no study {name!r} in {mask_url(url)}") from None
    stored = study.user_attrs.get("spec")
    if stored:
        spec = spec_from_dict(stored, source=f"{mask_url(url)} (study {name})")
    if spec is None:
        raise TuneError(f"study {name!r} has no stored spec; give --study")
    return spec, name, study_dir, url


def cmd_export(args: argparse.Namespace) -> int:
    from workbench.tune.tuner import Tuner

    spec, name, study_dir, url = _existing(args)
    study = optuna.load_study(study_name=name, storage=make_storage(url))
    tuner = Tuner(spec, study_name=name, out_root=study_dir.parent, storage_url=url, progress=False)
    result = tuner.stored_result()
    vpath = study_dir / "validation.json"
    if result is None:
        print(f"{study_dir / 'tune.json'} holds no finished result: exporting from "
              f"{vpath if vpath.exists() else 'the baseline alone'}; finish the study with "
              f"`python -m workbench.tune --study {args.study or name}` to validate candidates", file=sys.stderr)
        validation = json.loads(vpath.read_text()) if vpath.exists() else \
            {"candidates": [], "winner": {"trial": None, "significant": False}}
        result = tuner.stored_study_result(study, validation)
    path = export_config(spec, study_dir, result, launch_record=winner_launch_record(study, result))
    print(path)
    return EXIT_OK


def cmd_report(args: argparse.Namespace) -> int:
    from reports import build_report

    _spec, name, study_dir, url = _existing(args)
    print(build_report(study_dir, url, name))
    return EXIT_OK


def cmd_verify(args: argparse.Namespace) -> int:
    from workbench.tune.tuner import Tuner
    from workbench.tune.verify import verify_lines

    spec, name, study_dir, url = _existing(args)
    tuner = Tuner(spec, study_name=name, out_root=study_dir.parent, storage_url=url, progress=False,
                  confirm=_confirm_command(args.yes))
    record = tuner.verify(pairs=args.pairs)
    print("\n".join(verify_lines(record)), flush=True)
    return EXIT_OK if record["holds"] is not False else EXIT_ERROR


def cmd_tune(args: argparse.Namespace) -> int:
    stored_name = _stored_name(args)  # resumes a study of one's own by name, with its stored spec
    if stored_name and args.seed is not None:
        raise TuneError(f"--seed {args.seed}: study {stored_name!r} resumes with the spec it holds, seed included; "
                        "to search again with another seed, start a study of its own (--study SPEC --study-name NEW)")
    spec = None if stored_name else _resolve_spec(args)
    if args.study_name:
        check_name(args.study_name, "--study-name")  # (before the imports below, as Tuner checks it)
    from reports import build_report
    from workbench.memory.lifetimes import study_lifetimes
    from workbench.tune.trial import ignore_interrupts
    from workbench.tune.tuner import Tuner

    tuner = Tuner(spec, study_name=args.study_name or stored_name, out_root=args.out, storage_url=args.storage, trials=args.trials,
                  timeout_s=args.timeout, gpu_minutes=args.gpu_minutes, worker=args.worker, report=None if args.no_report else build_report,
                  lifetimes=study_lifetimes, progress=not args.no_progress, confirm=_confirm_command(args.yes),
                  reset=_confirm_reset(args.yes) if args.reset else None, reference=not args.no_reference)
    try:
        tuner.run()
    except KeyboardInterrupt:
        ignore_interrupts()  # the rest of a burst of Ctrl-Cs changes nothing
        print(f"\ninterrupted: the running trial was stopped and marked FAIL (status interrupted); finished "
              f"trials are kept in {tuner.storage_shown}.\nResume with: {_resume_hint()}", file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_OK


def _study_name_of(args: argparse.Namespace) -> str:
    """The name the study's folder has: --study-name, else the spec's ``name`` (a spec file's name need not be its
    file's stem), else what --study says."""
    if args.study_name:
        return args.study_name
    try:
        return _stored_name(args) or load_study_spec(args.study or DEFAULT_STUDY).name
    except (ConfigError, OSError, ValueError):
        return Path(args.study).stem if args.study else DEFAULT_STUDY


def _environment_error(e: BaseException, args: argparse.Namespace) -> str:
    """One line for a filesystem or storage fault: the path or database, what went wrong, what to do."""
    if isinstance(e, DiskError):  # its message names the file and what to do
        return f"{e} (rerun with --debug for the traceback)"
    if isinstance(e, OSError):
        where = e.filename or args.out
        return (f"{where}: {e.strerror or e}; the study's files go under --out {args.out!r}: give a writable "
                f"directory (rerun with --debug for the traceback)")
    orig = getattr(e, "orig", None) or getattr(e, "__cause__", None) or e
    reason = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
    if args.storage:
        where = mask_url(normalize_storage_url(args.storage))
    else:
        where = str(Path(args.out).resolve() / _study_name_of(args) / "study.db")
    return (f"{where}: the study storage cannot be used ({reason}); if it is damaged, move it aside and start "
            f"the study again, or give another --out / --storage (rerun with --debug for the traceback)")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    prev = signal.getsignal(signal.SIGTERM)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)  # `kill` stops as cleanly as Ctrl-C
    try:
        if args.command == "export":
            return cmd_export(args)
        if args.command == "report":
            return cmd_report(args)
        if args.command == "verify":
            return cmd_verify(args)
        return cmd_tune(args)
    except (TuneError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        if args.debug:
            traceback.print_exc()
        return EXIT_USAGE if isinstance(e, ConfigError) else EXIT_ERROR
    except (OSError, sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError) as e:
        print(f"error: {_environment_error(e, args)}", file=sys.stderr)
        if args.debug:
            traceback.print_exc()
        return EXIT_USAGE
    finally:
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGTERM) is _raise_keyboard_interrupt:
            signal.signal(signal.SIGTERM, prev)


if __name__ == "__main__":
    sys.exit(main())

