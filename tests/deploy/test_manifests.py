"""deploy/: every manifest parses, runs the image deploy/Dockerfile builds, and points at commands,
pipelines and files that exist in this repository; secrets come from outside, ports stay on loopback."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml

from paretolab.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
IMAGE = "paretolab:latest"
IMAGE_WORKDIR = "/opt/paretolab"


def load(name: str):
    return yaml.safe_load((DEPLOY / name).read_text())


def check_paretolab_command(argv: list[str]) -> None:
    """`paretolab ...` or `python -m paretolab.cli ...`: the CLI accepts it and any pipeline it names is in the image."""
    if argv[:3] == ["python", "-m", "paretolab.cli"]:
        argv = argv[3:]
    else:
        assert argv[0] == "paretolab", argv
        argv = argv[1:]
    args = build_parser().parse_args(argv)  # exits (fails the test) on an unknown verb or flag
    pipeline = getattr(args, "pipeline", None)
    if pipeline:
        assert pipeline.startswith(IMAGE_WORKDIR + "/"), pipeline
        assert (ROOT / pipeline.removeprefix(IMAGE_WORKDIR + "/")).is_file(), pipeline


def test_the_dockerfile_copies_files_that_exist_and_installs_the_entrypoint():
    text = (DEPLOY / "Dockerfile").read_text()
    copies = re.findall(r"^COPY\s+(\S+)\s+\S+", text, flags=re.M)
    assert {"core", "plugins", "compute_kernels", "pipelines", "dashboard", "pyproject.toml"} <= set(copies)
    for source in copies:
        assert (ROOT / source).exists(), source
    assert f"WORKDIR {IMAGE_WORKDIR}" in text
    makefile_torch = re.search(r"^TORCH\s*\?=\s*(\S+)", (ROOT / "Makefile").read_text(), flags=re.M).group(1)
    assert f'ARG TORCH="{makefile_torch}"' in text  # the same pinned torch as `make`
    assert 'paretolab = "paretolab.cli:main"' in (ROOT / "pyproject.toml").read_text()
    assert "USER ray" in text  # not root


def test_compose_runs_the_whole_cluster_from_the_repo_image_on_loopback():
    compose = load("compose.yaml")
    services = compose["services"]
    assert {"postgres", "mlflow", "ray-head", "ray-worker", "ray-gpu-worker", "dashboard"} <= set(services)
    for name, service in services.items():
        if "build" in service:
            assert service["image"] == IMAGE
            assert (DEPLOY / service["build"]["context"] / service["build"]["dockerfile"]).resolve() == DEPLOY / "Dockerfile"
        else:
            assert re.fullmatch(r"postgres:\d+", service["image"]), name  # the one outside image: pinned, official
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DEPLOY / source).is_file(), source
        for value in (service.get("environment") or {}).values():
            for match in re.findall(r"://[^:/@\s]+:([^@\s]+)@", str(value)):
                assert match.startswith("${"), f"{name}: a literal password in {value}"
    env = services["ray-head"]["environment"]
    assert env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN"].startswith("${RAY_AUTH_TOKEN")
    assert env["PARETOLAB_TRACKING_URI"] == "http://mlflow:5000" and "@postgres:5432/optuna" in env["PARETOLAB_OPTUNA_STORAGE"]
    assert services["ray-gpu-worker"]["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    check_paretolab_command(services["dashboard"]["command"])
    mlflow = services["mlflow"]
    assert mlflow["command"][:2] == ["mlflow", "server"] and "--artifacts-destination" in mlflow["command"]
    assert "postgresql" in mlflow["environment"]["MLFLOW_BACKEND_STORE_URI"]
    assert "optuna" in (DEPLOY / "postgres-init.sql").read_text() and "mlflow" in (DEPLOY / "postgres-init.sql").read_text()
    for name in ("ray-head", "ray-worker"):
        assert services[name]["command"][:2] == ["ray", "start"]


def test_kuberay_cluster_has_a_gpu_group_and_the_job_runs_a_pipeline_in_the_image():
    cluster = load("kuberay/raycluster.yaml")
    job = load("kuberay/rayjob.yaml")
    assert (cluster["apiVersion"], cluster["kind"]) == ("ray.io/v1", "RayCluster")
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    import ray

    assert cluster["spec"]["rayVersion"] == ray.__version__
    pods = [cluster["spec"]["headGroupSpec"]["template"]] + [g["template"] for g in cluster["spec"]["workerGroupSpecs"]]
    pods.append(job["spec"]["submitterPodTemplate"])
    for pod in pods:
        for container in pod["spec"]["containers"]:
            assert container["image"] == IMAGE
            assert {"name": "RAY_AUTH_MODE", "value": "token"} in container["env"]
            assert container["envFrom"] == [{"secretRef": {"name": "paretolab-stores"}}]  # stores and token from a Secret
    gpu = next(g for g in cluster["spec"]["workerGroupSpecs"] if g["groupName"] == "gpu")
    limits = gpu["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == gpu["rayStartParams"]["num-gpus"] == "1"
    assert job["spec"]["clusterSelector"]["ray.io/cluster"] == cluster["metadata"]["name"]
    check_paretolab_command(shlex.split(job["spec"]["entrypoint"]))


def test_cluster_launcher_starts_the_image_with_the_job_api_on_loopback():
    launcher = load("cluster-launcher.yaml")
    assert launcher["docker"]["image"] == IMAGE
    head = " ".join(launcher["head_start_ray_commands"])
    assert "ray start --head" in head and "--dashboard-host=127.0.0.1" in head
    assert any("ray start --address=$RAY_HEAD_IP:6379" in c for c in launcher["worker_start_ray_commands"])
    assert "--env-file /etc/paretolab/env" in launcher["docker"]["run_options"]
    assert "RAY_AUTH_TOKEN" in (DEPLOY / "cluster-launcher.yaml").read_text()


def test_deploy_readme_says_when_to_use_which_file():
    text = (DEPLOY / "README.md").read_text()
    for name in ("compose.yaml", "kuberay/raycluster.yaml", "kuberay/rayjob.yaml", "cluster-launcher.yaml", "Dockerfile"):
        assert name in text
        assert (DEPLOY / name).is_file()
