"""Offline validation of rendered manifests: what an API server would refuse, without one.

- core kinds (Service, Job) against Kubernetes' own OpenAPI schemas, as shipped by
  ``kubernetes-validate`` for ``KUBE_VERSION``, in strict mode (an unknown field is an error);
- a JobSet against the CRD's ``openAPIV3Schema`` vendored from kubernetes-sigs/jobset (``schemas/``),
  made strict the same way (the API server would silently prune an unknown field: for a rendering,
  that is a bug); its embedded Job templates also against the strict core Job schema;
- the naming rules the API server and the JobSet webhook enforce in code, not in schemas (DNS
  labels, generated Job, pod and host names within 63 characters).

Needs ``kubernetes-validate`` and ``jsonschema`` (the ``dev`` extra); imported only here.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

from .manifests import JOBSET_API

KUBE_VERSION = "1.33.0"
JOBSET_RELEASE = "v0.12.0"
SCHEMA_PATH = Path(__file__).resolve().parent / "schemas" / "jobset.x-k8s.io_jobsets.v1alpha2.json"
DNS_1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS_1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
POD_SUFFIX = 6  # "-" and the 5 random characters of a generated pod name


class ValidatorsMissing(ImportError):
    """kubernetes-validate or jsonschema is not installed."""


def validate_manifests(docs: list[dict[str, Any]], kube_version: str = KUBE_VERSION) -> list[str]:
    """Every problem as ``Kind/name: message``; an empty list means both validators accept them."""
    problems: list[str] = []
    for doc in docs:
        where = f"{doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"
        if doc.get("apiVersion") == JOBSET_API and doc.get("kind") == "JobSet":
            problems += [f"{where}: {m}" for m in jobset_schema_problems(doc)]
            for rj in (doc.get("spec") or {}).get("replicatedJobs") or []:
                job = _embedded_job(doc, rj)
                problems += [
                    f"{where}: replicatedJobs[{rj.get('name')}]: {m}" for m in core_problems(job, kube_version)
                ]
        else:
            problems += [f"{where}: {m}" for m in core_problems(doc, kube_version)]
        problems += [f"{where}: {m}" for m in name_problems(doc)]
    return problems


def core_problems(doc: dict[str, Any], kube_version: str = KUBE_VERSION) -> list[str]:
    try:
        import kubernetes_validate
    except ImportError as exc:
        raise ValidatorsMissing("pip install kubernetes-validate (the dev extra) to validate offline") from exc
    try:
        kubernetes_validate.validate(doc, kube_version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        path = ".".join(str(p) for p in exc.absolute_path)
        return [f"{path or '(top)'}: {exc.message[:300]} (Kubernetes {kube_version} schema)"]
    except kubernetes_validate.SchemaNotFoundError as exc:
        return [f"no Kubernetes {kube_version} schema for it: {exc}"]
    return []


def jobset_schema_problems(doc: dict[str, Any]) -> list[str]:
    validator = _jobset_validator()
    out = []
    for err in sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path))):
        path = ".".join(str(p) for p in err.absolute_path)
        out.append(f"{path or '(top)'}: {err.message[:300]} (JobSet CRD {JOBSET_RELEASE})")
    return out


@functools.lru_cache(maxsize=1)
def _jobset_validator() -> Any:
    try:
        import jsonschema
    except ImportError as exc:
        raise ValidatorsMissing("pip install jsonschema (the dev extra) to validate offline") from exc
    schema = _strict(json.loads(SCHEMA_PATH.read_text()))
    return jsonschema.Draft7Validator(schema)


def _strict(node: Any) -> Any:
    """additionalProperties: false on every object that lists its properties and keeps no unknown ones."""
    if isinstance(node, list):
        return [_strict(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: _strict(v) for k, v in node.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def _embedded_job(jobset: dict[str, Any], rj: dict[str, Any]) -> dict[str, Any]:
    template = rj.get("template") or {}
    meta = dict(template.get("metadata") or {})
    meta["name"] = f"{jobset['metadata']['name']}-{rj.get('name')}-0"
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": template.get("spec")}


def name_problems(doc: dict[str, Any]) -> list[str]:
    """Names the API server checks in code (and the JobSet webhook's generated-name rules)."""
    out = []
    meta = doc.get("metadata") or {}
    name = str(meta.get("name", ""))
    kind = doc.get("kind")
    if not (DNS_1123_SUBDOMAIN.fullmatch(name) and len(name) <= 253):
        out.append(f"metadata.name {name!r} is not a DNS-1123 subdomain")
    if kind == "Service" and not (DNS_1035_LABEL.fullmatch(name) and len(name) <= 63):
        out.append(f"a Service name must be a DNS-1035 label (≤ 63, starts with a letter): {name!r}")
    for key, value in {**(meta.get("labels") or {})}.items():
        if len(str(value)) > 63:
            out.append(f"label {key}: value longer than 63 characters")
    if kind == "Job":
        out += _pod_name_problems(
            name, doc.get("spec") or {}, ((doc.get("spec") or {}).get("template") or {}).get("spec") or {}
        )
    if kind == "JobSet":
        spec = doc.get("spec") or {}
        subdomain = (spec.get("network") or {}).get("subdomain") or name
        if not (DNS_1035_LABEL.fullmatch(subdomain) and len(subdomain) <= 63):
            out.append(f"spec.network.subdomain {subdomain!r} must be a DNS-1035 label of at most 63 characters")
        for rj in spec.get("replicatedJobs") or []:
            for j in range(int(rj.get("replicas", 1))):
                job_name = f"{name}-{rj.get('name')}-{j}"
                job_spec = (rj.get("template") or {}).get("spec") or {}
                out += _pod_name_problems(job_name, job_spec, {"subdomain": subdomain})
    return out


def _pod_name_problems(job_name: str, job_spec: dict[str, Any], pod_spec: dict[str, Any]) -> list[str]:
    out = []
    if len(job_name) > 63:
        out.append(f"Job name {job_name!r} is longer than 63 characters")
    if job_spec.get("completionMode") == "Indexed":
        last = int(job_spec.get("completions") or 1) - 1
        hostname = f"{job_name}-{last}"
        if not DNS_1123_LABEL.fullmatch(hostname) or len(hostname) > 63:
            out.append(f"pod hostname {hostname!r} is not a DNS-1123 label of at most 63 characters")
        if len(hostname) + POD_SUFFIX > 63:
            out.append(f"pod names {hostname}-xxxxx would be longer than 63 characters")
    subdomain = pod_spec.get("subdomain")
    if subdomain is not None and not (DNS_1123_LABEL.fullmatch(subdomain) and len(subdomain) <= 63):
        out.append(f"pod subdomain {subdomain!r} is not a DNS-1123 label")
    return out
