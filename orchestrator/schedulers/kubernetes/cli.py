"""`tfcluster render`: the manifests of ``scheduler: kubernetes`` specs, printed or written per job."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ...core.errors import UsageError
from ..command import SchedulerCommand

if TYPE_CHECKING:
    from ...plan import Plan


def render_specs(
    paths: list[str], *, flavor: str | None, output_dir: str | None, run_id: str | None, check: bool
) -> None:
    from ... import __version__
    from ...runs import write_private
    from ...spec import load_spec
    from .manifests import render, to_yaml, with_flavor
    from .plan import kubernetes_plan

    if output_dir:
        _check_output_dir(output_dir)
    texts = []
    for path in paths:
        loaded = load_spec(path)
        for w in loaded.warnings:
            print(str(w), file=sys.stderr)
        spec = loaded.spec
        if spec.scheduler != "kubernetes":
            raise UsageError(f"{path}: scheduler is {spec.scheduler}; render is for scheduler: kubernetes specs")
        spec = with_flavor(spec, flavor)
        assert spec.kubernetes is not None
        plan = kubernetes_plan(spec, run_id=run_id or spec.name)
        for w in plan.warnings:
            print(f"{path}: warning: {w}", file=sys.stderr)
        docs = render(spec, plan)
        if check:
            _check(path, docs)
        header = (
            f"{spec.name}: {_tasks(plan)} as {spec.kubernetes.flavor} in namespace "
            f"{spec.kubernetes.namespace}\nrendered by tfcluster {__version__} from {path}; apply with kubectl apply -f"
        )
        texts.append((spec.name, to_yaml(docs, header)))
    if output_dir:
        names = [name for name, _ in texts]
        if twice := sorted({n for n in names if names.count(n) > 1}):  # one file each: the second overwrote the first
            raise UsageError(
                f"-o {output_dir}: two specs are named {twice[0]!r}: each is written to NAME.yaml; rename one"
            )
        try:
            os.makedirs(output_dir, mode=0o700, exist_ok=True)
            for name, text in texts:
                dest = os.path.join(output_dir, f"{name}.yaml")
                write_private(Path(dest), text)  # it may hold a Secret: 0600 whatever the umask
                print(dest)
        except OSError as exc:
            raise UsageError(f"-o {output_dir}: cannot write there: {exc.strerror or exc}") from None
    else:
        sys.stdout.write("".join(text for _, text in texts))


def _check_output_dir(output_dir: str) -> None:
    """-o names a directory (made if missing): refuse a file before anything is rendered."""
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise UsageError(f"-o {output_dir}: exists and is not a directory; -o names a directory for the manifests")


def _check(path: str, docs: list[dict]) -> None:
    from .validate import JOBSET_RELEASE, KUBE_VERSION, ValidatorsMissing, validate_manifests

    try:
        problems = validate_manifests(docs)
    except ValidatorsMissing as exc:
        raise UsageError(f"--validate: {exc}") from None
    if problems:
        raise UsageError(f"{path}: the rendering does not validate:\n  " + "\n  ".join(problems))
    print(f"{path}: valid for Kubernetes {KUBE_VERSION} and JobSet {JOBSET_RELEASE} (offline schemas)", file=sys.stderr)


def _tasks(plan: Plan) -> str:
    """``3 MWMS task(s)``, or with roles ``parameter_server: chief:1 worker:2 ps:1``."""
    if not plan.has_roles:
        return f"{len(plan.nodes)} MWMS task(s)"
    counts: dict[str, int] = {}
    for n in plan.nodes:
        counts[n.task.type] = counts.get(n.task.type, 0) + 1
    return f"{plan.strategy}: " + " ".join(f"{t}:{c}" for t, c in counts.items())


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("specs", nargs="+", metavar="SPEC")
    p.add_argument("--flavor", choices=["jobset", "indexed-job"], help="override kubernetes.flavor")
    p.add_argument("-o", "--output-dir", metavar="DIR", help="write DIR/NAME.yaml per spec instead of printing")
    p.add_argument("--run-id", help="TFCLUSTER_RUN_ID of the pods (default: the job name)")
    p.add_argument(
        "--validate", action="store_true", help="check offline against the Kubernetes and JobSet schemas (dev extra)"
    )


def _render(args: argparse.Namespace) -> None:
    render_specs(args.specs, flavor=args.flavor, output_dir=args.output_dir, run_id=args.run_id, check=args.validate)


#: ``tfcluster render``: the manifests, for kubectl.
COMMANDS = [
    SchedulerCommand(
        name="render",
        summary="Kubernetes: print the manifests of scheduler: kubernetes specs (a JobSet, or Indexed Jobs + a "
        "Service).",
        example="tfcluster render cluster_specs/k8s-jobset.yaml | kubectl apply -f -\n"
        "tfcluster render cluster_specs/k8s-*.yaml --flavor indexed-job -o manifests/ --validate",
        arguments=_arguments,
        run=_render,
    )
]
