"""Static checks of the deployment files, run by tests/deploy.sh in target/deploy-venv.

    python tests/deploy_files.py unit|dockerfile|compose|k8s|readme

Each command checks one file (or directory) for what the others and Strata rely on, and
that they agree with each other: the image's UID and store path are what the Kubernetes
pod and the compose file use, and every stop timeout is longer than Strata's shutdown
(`grace-period`, read from config/strata.toml where it is set, plus the 5 s Strata waits
after it before it exits). Prints one line on success; exits 1 naming each problem.
"""

import re
import sys
import tomllib
from pathlib import Path

import yaml
from dockerfile_parse import DockerfileParser

ROOT = Path(__file__).resolve().parents[1]
STORE = "/var/lib/strata"
PORT = 8000
# Strata exits at most this long after grace-period on SIGTERM (src/cli/serve.rs).
EXIT_AFTER_GRACE_S = 5.0
DEFAULT_GRACE_S = 10.0
# glibc of the base images the Dockerfile may use: a binary built on one runs on
# those with the same or a newer glibc.
GLIBC = {
    "bullseye": (2, 31),
    "bookworm": (2, 36),
    "trixie": (2, 41),
    "ubuntu20.04": (2, 31),
    "ubuntu22.04": (2, 35),
    "ubuntu24.04": (2, 39),
}

problems: list[str] = []


def check(ok: bool, message: str) -> bool:
    if not ok:
        problems.append(message)
    return ok


def seconds(text) -> float:
    """A duration as systemd, compose or Kubernetes write it: `30`, `30s`, `1min 30s`,
    `1m30s`, `500ms`, `1h`."""
    if isinstance(text, (int, float)):
        return float(text)
    units = {"ms": 0.001, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600, "": 1}
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", str(text).strip())
    if not parts or "".join(n + u for n, u in parts) != re.sub(r"\s", "", str(text)):
        raise ValueError(f"not a duration: {text!r}")
    return sum(float(n) * units[u] for n, u in parts)


def find_key(table, key):
    """The value of `key` anywhere in a TOML table (nested tables included), or None."""
    if isinstance(table, dict):
        for k, v in table.items():
            if k == key:
                return v
            found = find_key(v, key)
            if found is not None:
                return found
    return None


def shutdown_s() -> float:
    """How long Strata may take to exit after SIGTERM with the documented config."""
    grace = DEFAULT_GRACE_S
    config = ROOT / "config" / "strata.toml"
    if config.exists():
        table = tomllib.loads(config.read_text())
        value = find_key(table, "grace-period")
        if value is not None:
            grace = seconds(value)
    return grace + EXIT_AFTER_GRACE_S


# --- systemd/strata.service ---


def unit_settings(path: Path) -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")) and "=" in line:
            key, value = line.split("=", 1)
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def cmd_unit() -> str:
    s = unit_settings(ROOT / "systemd" / "strata.service")
    one = lambda key: (s.get(key) or [""])[-1]  # noqa: E731
    check(one("Type") == "notify", "Type= must be notify: Strata sends READY=1 when it can serve")
    check("-HUP" in one("ExecReload"), "ExecReload= must send SIGHUP (Strata re-reads its config on it)")
    check(one("StateDirectory") == "strata", "StateDirectory= must be strata")
    check("STRATA_HOME=%S/strata" in s.get("Environment", []), "Environment=STRATA_HOME=%S/strata is missing")
    check(one("PrivateDevices") not in ("yes", "true", "1"), "PrivateDevices=yes hides /dev/nvidia*")
    check(one("MemoryDenyWriteExecute") not in ("yes", "true", "1"), "MemoryDenyWriteExecute=yes breaks CUDA's JIT")
    check(one("LimitMEMLOCK") == "infinity", "LimitMEMLOCK= must be infinity (pinned host memory)")
    if one("DevicePolicy") in ("closed", "strict"):
        allowed = " ".join(s.get("DeviceAllow", []))
        for group in ("char-nvidia-frontend", "char-nvidia-uvm"):
            check(group in allowed, f"DevicePolicy={one('DevicePolicy')} without DeviceAllow={group}")
    stop, need = seconds(one("TimeoutStopSec") or "90s"), shutdown_s()
    check(stop > need, f"TimeoutStopSec={one('TimeoutStopSec')} must exceed Strata's shutdown ({need:g}s)")
    return "Type=notify, reload by SIGHUP, store in StateDirectory, GPU devices reachable"


# --- Dockerfile and .dockerignore ---


def dockerignore_excludes(rel: str, patterns: list[str]) -> bool:
    """Whether Docker leaves `rel` out of the build context: the last pattern that matches
    the path or one of its parent directories decides (`!` re-includes)."""
    parts = rel.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").strip("/")
        regex = "^" + re.escape(pattern).replace(r"\*\*", ".*").replace(r"\*", "[^/]*").replace(r"\?", "[^/]") + "$"
        if any(re.match(regex, p) for p in prefixes):
            excluded = not negate
    return excluded


def stages(parser: DockerfileParser):
    """[(FROM value, [instructions])], and the instructions before the first FROM."""
    head, result = [], []
    for ins in parser.structure:
        if ins["instruction"] == "FROM":
            result.append((ins["value"], []))
        elif result:
            result[-1][1].append(ins)
        else:
            head.append(ins)
    return head, result


def glibc_of(image: str):
    for name, version in GLIBC.items():
        if name in image:
            return version
    return None


def read_dockerfile():
    parser = DockerfileParser(path=str(ROOT / "Dockerfile"))
    head, all_stages = stages(parser)
    named = {}
    for value, body in all_stages:
        m = re.fullmatch(r"(\S+)(?:\s+AS\s+(\S+))?", value.strip(), re.I)
        named[m.group(2) or f"#{len(named)}"] = (m.group(1), body)
    return head, all_stages, named


def final_user(all_stages) -> tuple[int, int] | None:
    users = [i["value"] for i in all_stages[-1][1] if i["instruction"] == "USER"]
    m = re.fullmatch(r"(\d+)(?::(\d+))?", users[-1]) if users else None
    return (int(m.group(1)), int(m.group(2) or m.group(1))) if m else None


def final_env(all_stages) -> dict[str, str]:
    env = {}
    for ins in all_stages[-1][1]:
        if ins["instruction"] == "ENV":
            for pair in re.findall(r"(\w+)=(\S+)", ins["value"]):
                env[pair[0]] = pair[1]
    return env


def cmd_dockerfile() -> str:
    head, all_stages, named = read_dockerfile()
    args = {m.group(1): m.group(2) for i in head if i["instruction"] == "ARG" for m in [re.fullmatch(r"(\w+)(?:=(\S*))?", i["value"])]}
    check(args.get("VARIANT") == "cpu", "a global `ARG VARIANT=cpu` must come before the first FROM")
    for variant in ("cpu", "cuda"):
        check(f"runtime-{variant}" in named, f"no stage `runtime-{variant}`")
    check(all_stages[-1][0].strip() == "runtime-${VARIANT}", "the last stage must be `FROM runtime-${VARIANT}`")
    cuda_base = named.get("runtime-cuda", ("", []))[0]
    check(cuda_base.startswith("nvidia/cuda:") and "-runtime-" in cuda_base, "runtime-cuda must be an nvidia/cuda runtime image")

    builds = [(name, base) for name, (base, body) in named.items() if any("cargo build --release --locked" in i["value"] for i in body)]
    if check(len(builds) == 1, "exactly one stage must run `cargo build --release --locked`"):
        build_glibc = glibc_of(builds[0][1])
        for variant in ("cpu", "cuda"):
            base = named.get(f"runtime-{variant}", ("", []))[0]
            run_glibc = glibc_of(base)
            if check(None not in (build_glibc, run_glibc), f"unknown glibc for {builds[0][1]} or {base}: add it to GLIBC"):
                v = lambda t: ".".join(map(str, t))  # noqa: E731
                check(run_glibc >= build_glibc, f"runtime-{variant} ({base}, glibc {v(run_glibc)}) is older than the build stage ({builds[0][1]}, glibc {v(build_glibc)})")

    final = all_stages[-1][1]
    values = lambda kind: [i["value"] for i in final if i["instruction"] == kind]  # noqa: E731
    user = final_user(all_stages)
    check(user is not None and user[0] != 0, "the last USER must be a numeric non-root UID[:GID] (Kubernetes checks runAsNonRoot)")
    check(any(str(PORT) in v.split() for v in values("EXPOSE")), f"EXPOSE {PORT} is missing")
    check(any("/health" in v for v in values("HEALTHCHECK")), "HEALTHCHECK must probe /health")
    check(values("ENTRYPOINT")[-1:] == ['["strata"]'], 'ENTRYPOINT ["strata"] is missing')
    check(values("CMD")[-1:] == ['["serve"]'], 'CMD ["serve"] is missing')
    check(final_env(all_stages).get("STRATA_HOME") == STORE, f"ENV STRATA_HOME={STORE} is missing")
    check(any(STORE in v for v in values("VOLUME")), f"VOLUME {STORE} is missing")

    # The build context: every COPY source is in it, and nothing under src/ reads a file
    # at compile time that is not.
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines() if line.strip() and not line.startswith("#")]
    sources = []
    for _, body in all_stages:
        for ins in body:
            if ins["instruction"] in ("COPY", "ADD") and "--from" not in ins["value"]:
                words = [w for w in ins["value"].split() if not w.startswith("--")]
                sources += words[:-1]
    for source in sources:
        if not check((ROOT / source).exists(), f"COPY {source}: no such file"):
            continue
        files = [source] if (ROOT / source).is_file() else [str(p.relative_to(ROOT)) for p in (ROOT / source).rglob("*") if p.is_file()]
        left_out = [f for f in files if dockerignore_excludes(f, patterns)]
        check(not left_out, f"COPY {source}: .dockerignore leaves out {left_out[:3]}")
    check(not (ROOT / "build.rs").exists() or "build.rs" in sources, "build.rs exists but is not copied")
    include = re.compile(r"include(?:_bytes|_str)?!\s*\(\s*(?:concat!\s*\(\s*env!\s*\(\s*\"CARGO_MANIFEST_DIR\"\s*\)\s*,\s*)?\"([^\"]+)\"")
    copied = [ROOT / s for s in sources]
    for rs in (ROOT / "src").rglob("*.rs"):
        text = rs.read_text()
        for m in include.finditer(text):
            target = (ROOT / m.group(1).lstrip("/")) if "CARGO_MANIFEST_DIR" in m.group(0) else (rs.parent / m.group(1))
            target = target.resolve()
            check(any(target == c or c in target.parents for c in copied), f"{rs.relative_to(ROOT)} includes {m.group(1)}, which the image build does not copy")
    return f"stages runtime-cpu/runtime-cuda, glibc compatible, USER {user[0] if user else '?'}, context has what the build reads"


# --- deploy/compose.yaml ---


def cmd_compose() -> str:
    compose = yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())
    services = compose.get("services") or {}
    if not check("strata" in services, "no service `strata`"):
        return ""
    svc = services["strata"]
    build = svc.get("build") or {}
    context = (ROOT / "deploy" / build.get("context", ".")).resolve()
    check(context == ROOT, f"build.context must be the repository root, not {context}")
    check((context / build.get("dockerfile", "Dockerfile")).exists(), "build.dockerfile does not exist")
    check("VARIANT" in (build.get("args") or {}), "build.args.VARIANT is missing")
    check(any(str(p).split(":")[-1] == str(PORT) for p in svc.get("ports", [])), f"no port mapping to container port {PORT}")
    volumes = [str(v).split(":") for v in svc.get("volumes", [])]
    store = [v[0] for v in volumes if len(v) > 1 and v[1] == STORE]
    check(store and store[0] in (compose.get("volumes") or {}), f"a named volume (declared under volumes:) must be mounted at {STORE}")
    devices = (((svc.get("deploy") or {}).get("resources") or {}).get("reservations") or {}).get("devices") or []
    check(any(d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", []) for d in devices), "no nvidia GPU reservation under deploy.resources.reservations.devices")
    check("/health" in str((svc.get("healthcheck") or {}).get("test")), "the healthcheck must probe /health")
    need = shutdown_s()
    check(seconds(svc.get("stop_grace_period", "10s")) > need, f"stop_grace_period must exceed Strata's shutdown ({need:g}s)")
    return "service strata: build from the root, port, store volume, GPU reservation, healthcheck, stop grace"


# --- deploy/k8s/ ---


def cmd_k8s() -> str:
    docs = {}
    for path in sorted((ROOT / "deploy" / "k8s").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                docs[(doc["kind"], doc["metadata"]["name"])] = doc
    deployments = [d for (kind, _), d in docs.items() if kind == "Deployment"]
    if not check(len(deployments) == 1, "deploy/k8s/ must hold one Deployment"):
        return ""
    dep = deployments[0]
    pod = dep["spec"]["template"]["spec"]
    _, all_stages, _ = read_dockerfile()
    uid, gid = final_user(all_stages) or (None, None)
    psc = pod.get("securityContext") or {}
    check(psc.get("runAsNonRoot") is True, "pod securityContext.runAsNonRoot must be true")
    check(psc.get("runAsUser") == uid, f"runAsUser {psc.get('runAsUser')} is not the image's UID {uid}")
    check(psc.get("fsGroup") == gid, f"fsGroup {psc.get('fsGroup')} is not the image's GID {gid}")
    need = shutdown_s()
    check(pod.get("terminationGracePeriodSeconds", 30) > need, f"terminationGracePeriodSeconds must exceed Strata's shutdown ({need:g}s)")

    (container,) = [c for c in pod["containers"] if c["name"] == "strata"]
    csc = container.get("securityContext") or {}
    check(csc.get("allowPrivilegeEscalation") is False, "allowPrivilegeEscalation must be false")
    check("ALL" in ((csc.get("capabilities") or {}).get("drop") or []), "capabilities must drop ALL")
    ports = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
    check(PORT in ports.values(), f"containerPort {PORT} is missing")
    check("nvidia.com/gpu" in ((container.get("resources") or {}).get("limits") or {}), "no nvidia.com/gpu limit")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        spec = container.get(probe)
        if check(spec is not None, f"{probe} is missing") and "httpGet" in spec:
            get = spec["httpGet"]
            check(get.get("path") == "/health", f"{probe} must GET /health")
            check(ports.get(get.get("port"), get.get("port")) == PORT, f"{probe} probes a port Strata does not listen on")

    mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    home = env.get("STRATA_HOME") or final_env(all_stages).get("STRATA_HOME")
    store = volumes.get(mounts.get(home or ""), {})
    claim = (store.get("persistentVolumeClaim") or {}).get("claimName")
    check(("PersistentVolumeClaim", claim) in docs, f"STRATA_HOME ({home}) must be a PersistentVolumeClaim defined in deploy/k8s/")
    if csc.get("readOnlyRootFilesystem"):
        check("/tmp" in mounts, "readOnlyRootFilesystem needs a volume at /tmp")
    for volume in volumes.values():
        cm = volume.get("configMap")
        if cm and check(("ConfigMap", cm["name"]) in docs, f"ConfigMap {cm['name']} is not defined in deploy/k8s/"):
            for key, text in docs[("ConfigMap", cm["name"])].get("data", {}).items():
                if key.endswith(".toml"):
                    try:
                        tomllib.loads(text)
                    except tomllib.TOMLDecodeError as e:
                        check(False, f"ConfigMap {cm['name']} {key}: {e}")

    labels = dep["spec"]["template"]["metadata"]["labels"]
    services = [d for (kind, _), d in docs.items() if kind == "Service"]
    check(bool(services), "no Service")
    for svc in services:
        selector = svc["spec"].get("selector") or {}
        check(selector and all(labels.get(k) == v for k, v in selector.items()), f"Service {svc['metadata']['name']} selects no Strata pod")
        for p in svc["spec"]["ports"]:
            target = p.get("targetPort", p["port"])
            check(ports.get(target, target) == PORT, f"Service {svc['metadata']['name']} targets port {target}, not Strata's")
    return f"runs as the image's UID {uid}, probes /health, store on a PVC, Service reaches port {PORT}"


# --- deploy/README.md ---


def nginx_directives(text: str) -> list[str]:
    lines = (re.sub(r"\s+", " ", line.split("#", 1)[0]).strip() for line in text.splitlines())
    return [line for line in lines if line]


def cmd_readme() -> str:
    readme = (ROOT / "deploy" / "README.md").read_text()
    blocks = re.findall(r"^```nginx\n(.*?)^```", readme, re.S | re.M)
    if check(len(blocks) == 1, "deploy/README.md must show the nginx example in one ```nginx block"):
        shown, real = nginx_directives(blocks[0]), nginx_directives((ROOT / "deploy" / "nginx.conf").read_text())
        check(shown == real, f"deploy/README.md's nginx example differs from deploy/nginx.conf: {sorted(set(shown) ^ set(real))[:4]}")
    return "its nginx example is deploy/nginx.conf"


def main() -> int:
    commands = {"unit": cmd_unit, "dockerfile": cmd_dockerfile, "compose": cmd_compose, "k8s": cmd_k8s, "readme": cmd_readme}
    if len(sys.argv) != 2 or sys.argv[1] not in commands:
        print(f"usage: {sys.argv[0]} {'|'.join(commands)}", file=sys.stderr)
        return 2
    summary = commands[sys.argv[1]]()
    if problems:
        for p in problems:
            print(p, file=sys.stderr)
        return 1
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
