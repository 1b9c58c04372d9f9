"""`tfcluster render`: the manifests of ``scheduler: kubernetes`` specs, printed or written per job."""

from __future__ import annotations

import os
import sys

from ...core.errors import UsageError


def render_specs(
    paths: list[str], *, flavor: str | None, output_dir: str | None, run_id: str | None, check: bool
) -> None:
    from ... import __version__
    from ...spec import load_spec
    from .plan import kubernetes_plan
    from .render import render, to_yaml, with_flavor

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
            f"{spec.name}: {len(plan.nodes)} MWMS task(s) as {spec.kubernetes.flavor} in namespace "
            f"{spec.kubernetes.namespace}\nrendered by tfcluster {__version__} from {path}; apply with kubectl apply -f"
        )
        texts.append((spec.name, to_yaml(docs, header)))
    if output_dir:
        os.makedirs(output_dir, exist_ok=True)
        for name, text in texts:
            dest = os.path.join(output_dir, f"{name}.yaml")
            with open(dest, "w") as f:
                f.write(text)
            print(dest)
    else:
        sys.stdout.write("".join(text for _, text in texts))


def _check(path: str, docs: list[dict]) -> None:
    from .validate import JOBSET_RELEASE, KUBE_VERSION, ValidatorsMissing, validate_manifests

    try:
        problems = validate_manifests(docs)
    except ValidatorsMissing as exc:
        raise UsageError(f"--validate: {exc}") from None
    if problems:
        raise UsageError(f"{path}: the rendering does not validate:\n  " + "\n  ".join(problems))
    print(f"{path}: valid for Kubernetes {KUBE_VERSION} and JobSet {JOBSET_RELEASE} (offline schemas)", file=sys.stderr)
