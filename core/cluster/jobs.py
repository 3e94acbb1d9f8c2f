"""Studies as Ray jobs: `paretolab submit` and `paretolab jobs`, with Ray's job API wrapped once here.

A submitted job carries the pipeline and the third-party plugins it uses (the job's working
directory, which Ray puts on every worker's PYTHONPATH: each plugin's module and its
distribution's ``.dist-info``, so its entry point is found there) and paretolab's own code
(``py_modules``), so the cluster needs only the dependencies (the deploy/ image has paretolab's;
a plugin's own must be on the image).
Inside the job the driver runs ``paretolab run PIPELINE --resume --address auto``: submitting the
same pipeline again finishes a study whose driver died.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from paretolab.cluster.ray_auth import is_auth_error, token_help, use_token_if_present
from paretolab.cluster.reach import require_reachable
from paretolab.errors import ConfigError, ParetolabError, first_line
from paretolab.plugin_api.manager import BUILTIN_PLUGINS, plugin_manager, registries
from paretolab.stores.locations import OPTUNA_ENV, TRACKING_ENV, has_password, redact

if TYPE_CHECKING:
    from paretolab.study.spec import (
        StudySpec,  # the cluster layer sits below the study: the spec is handed in
    )

T = TypeVar("T")

PACKAGES = ("paretolab", "paretolab.plugins", "paretolab.kernels", "paretolab.pipelines", "paretolab.dashboard")
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
STUDY_KEY = "paretolab.study"
PIPELINE_FILE = "pipeline.yaml"

@dataclass(frozen=True)
class Submission:
    """What `paretolab submit` sends: the job id and where the job's stores come from."""

    job_id: str
    study: str
    stores: str  # a description for the user, with any password redacted


def jobs_address(address: str | None) -> str:
    """The head's dashboard URL (`http://HEAD:8265`); `--address` or RAY_ADDRESS."""
    address = address or os.environ.get("RAY_ADDRESS")
    if not address:
        raise ConfigError("--address: give the Ray head's dashboard address, e.g. --address http://HEAD:8265 (or set RAY_ADDRESS)")
    if "://" not in address:
        address = f"http://{address}"
    if not address.startswith(("http://", "https://")):
        raise ConfigError(f"--address: expected the head's dashboard URL such as http://HEAD:8265, got {address!r}")
    return address.rstrip("/")


def client(address: str | None) -> Any:
    """A JobSubmissionClient for the head, presenting this machine's token when there is one."""
    url = jobs_address(address)
    require_reachable("--address", url)
    use_token_if_present()
    from ray.job_submission import JobSubmissionClient

    try:
        return JobSubmissionClient(url)
    except Exception as exc:
        raise _explain(exc, url) from exc


def submit(
    spec: StudySpec,
    pipeline: str | Path,
    *,
    address: str | None,
    trials: int | None = None,
    storage: str | None = None,
    tracking_uri: str | None = None,
    ship_code: bool = True,
    env: dict[str, str] | None = None,
) -> Submission:
    """Submit the study of ``spec`` (parsed from the file ``pipeline``, so already validated here) as a Ray job."""
    env_vars = dict(env or {})
    for flag, key, value in (("--storage", OPTUNA_ENV, storage), ("--tracking-uri", TRACKING_ENV, tracking_uri)):
        if value:
            _refuse_password(flag, value, key)
            env_vars[key] = value
    jobs = client(address)
    args = ["python", "-m", "paretolab.cli", "run", PIPELINE_FILE, "--resume", "--address", "auto", "--no-progress"]
    if trials:
        args += ["--trials", str(int(trials))]
    with tempfile.TemporaryDirectory(prefix="paretolab-submit-") as tmp:
        workdir = Path(tmp) / "job"
        workdir.mkdir()
        shutil.copyfile(pipeline, workdir / PIPELINE_FILE)
        runtime_env: dict[str, Any] = {"working_dir": str(workdir)}
        if ship_code:
            runtime_env["py_modules"] = [str(stage_package(Path(tmp) / "code"))]
            for path in plugin_files(spec):
                if path.is_dir():
                    shutil.copytree(path, workdir / path.name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "build"))
                else:
                    shutil.copyfile(path, workdir / path.name)
        if env_vars:
            runtime_env["env_vars"] = env_vars
        job_id = f"paretolab-{spec.name}-{uuid.uuid4().hex[:8]}"
        try:
            jobs.submit_job(entrypoint=" ".join(args), submission_id=job_id, runtime_env=runtime_env, metadata={STUDY_KEY: spec.name})
        except Exception as exc:
            raise _explain(exc, jobs_address(address)) from exc
    if storage or tracking_uri:
        where = f"Optuna {redact(storage or 'the cluster default')}, MLflow {redact(tracking_uri or 'the cluster default')}"
    else:
        where = f"the cluster's own ({OPTUNA_ENV} / {TRACKING_ENV} on its nodes; else SQLite in the job's working directory)"
    return Submission(job_id=job_id, study=spec.name, stores=where)


def _ask(address: str | None, request: Callable[[Any], T], job_id: str | None = None) -> T:
    """Run one request against the head's job API; any failure becomes an error that says what to check."""
    jobs = client(address)
    try:
        return request(jobs)
    except Exception as exc:
        raise _explain(exc, jobs_address(address), job_id) from exc


def list_jobs(address: str | None) -> list[dict[str, Any]]:
    """Every job the head knows, newest first, as plain rows."""
    rows = [_row(d) for d in _ask(address, lambda jobs: jobs.list_jobs())]
    return sorted(rows, key=lambda r: r["start_time"] or 0, reverse=True)


def job_status(address: str | None, job_id: str) -> dict[str, Any]:
    """One job's status, message and study."""
    return _row(_ask(address, lambda jobs: jobs.get_job_info(job_id), job_id))


def job_logs(address: str | None, job_id: str) -> str:
    """The job driver's output so far."""
    return str(_ask(address, lambda jobs: jobs.get_job_logs(job_id), job_id))


def stop_job(address: str | None, job_id: str) -> bool:
    """Ask Ray to stop the job (SIGTERM to the driver, which ends its trials as failed)."""
    return bool(_ask(address, lambda jobs: jobs.stop_job(job_id), job_id))


def stage_package(dest: Path) -> Path:
    """A copy of the installed paretolab package tree (editable or not) to ship as a py_module."""
    top = _package_dir("paretolab")
    for name in PACKAGES:
        source = _package_dir(name)
        if name != "paretolab" and top in source.parents:
            continue  # a regular install: already copied with its parent
        target = dest.joinpath(*name.split("."))
        shutil.copytree(source, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "build"))
    return dest / "paretolab"


def plugin_files(spec: StudySpec) -> list[Path]:
    """For each third-party plugin the pipeline uses: its top-level module (file or package) and its ``.dist-info``."""
    regs = registries()
    owners = {regs.methods.owner(option.method) for stage in spec.stages for option in stage.options}
    owners.add(regs.tasks.owner(spec.task))
    owners |= {regs.measures.owner(name) for name in spec.measures or {}}
    if spec.model in regs.models:
        owners.add(regs.models.owner(spec.model))
    files: list[Path] = []
    for owner in sorted(owners - set(BUILTIN_PLUGINS)):
        plugin = plugin_manager().get_plugin(owner)
        module_name = getattr(plugin, "__name__", type(plugin).__module__)
        top = sys.modules[module_name.split(".")[0]]
        if top.__name__ == "paretolab":
            continue  # shipped with paretolab's own code
        paths = list(getattr(top, "__path__", []))
        source = Path(paths[0] if paths else str(top.__file__)).resolve()
        for path in (source, _dist_info(top.__name__, owner)):
            if path not in files:
                files.append(path)
    return files


def _dist_info(top_module: str, owner: str) -> Path:
    """The installed ``.dist-info`` folder of the distribution that provides ``top_module``."""
    for name in importlib.metadata.packages_distributions().get(top_module, []):
        for file in importlib.metadata.distribution(name).files or []:
            if file.parent.name.endswith(".dist-info"):
                return Path(str(importlib.metadata.distribution(name).locate_file(file.parent))).resolve()
    raise ParetolabError(
        f"plugin {owner!r} ({top_module}) is not an installed distribution, so its entry point cannot travel to the "
        f"cluster: install it with `pip install` (docs/plugins.md), or submit with --no-code to an image that has it"
    )


def _package_dir(name: str) -> Path:
    found = importlib.util.find_spec(name)
    if found is None or not found.submodule_search_locations:
        raise ParetolabError(f"cannot find the installed package {name!r} to ship with the job; reinstall paretolab")
    return Path(list(found.submodule_search_locations)[0]).resolve()


def _refuse_password(flag: str, value: str, env_key: str) -> None:
    if has_password(value):
        raise ConfigError(
            f"{flag}: {redact(value)} holds a password, which Ray would keep in clear in the job's metadata. "
            f"Set {env_key} on the cluster's nodes instead (deploy/README.md), or drop the password from the URL "
            "and give the nodes PGPASSWORD or a ~/.pgpass file"
        )


def _row(info: Any) -> dict[str, Any]:
    meta = getattr(info, "metadata", None) or {}
    status = getattr(info, "status", "")
    return {
        "job_id": getattr(info, "submission_id", None) or getattr(info, "job_id", ""),
        "status": str(getattr(status, "value", status)),
        "study": meta.get(STUDY_KEY, ""),
        "message": next(iter((getattr(info, "message", "") or "").strip().splitlines()), ""),  # a blank message is no error
        "start_time": getattr(info, "start_time", None),
        "end_time": getattr(info, "end_time", None),
    }


def _explain(exc: Exception, address: str, job_id: str | None = None) -> ParetolabError:
    """Ray's errors, turned into one line that says what to do."""
    text = str(exc).strip()
    lowered = text.lower()
    if is_auth_error(exc) or ("401" in text and "token" in lowered):
        return ParetolabError(token_help(address))
    if job_id and ("does not exist" in lowered or "not found" in lowered or "404" in text):
        return ParetolabError(f"no job {job_id!r} on the Ray cluster at {address}; `paretolab jobs list --address {address}` lists them")
    if isinstance(exc, ConnectionError) or "connection" in lowered or "failed to connect" in lowered:
        return ParetolabError(f"could not reach the Ray head's job API at {address}: {first_line(exc)}")
    return ParetolabError(f"Ray job API at {address}: {first_line(exc)}")
