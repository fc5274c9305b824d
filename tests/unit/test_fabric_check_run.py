"""How the multi-node NVLink check runs (controller/fabriccheckrun.py, issue 18 point 4): the
objects of one run, the launcher's mpirun line, nvbandwidth's multinode output as the stand-in
tools print it (tests/standins: mpirun + nvbandwidth), each cross-node pair held to the class's
floor, and the launch's one-off SSH key."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tomllib
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fabricdra.controller import sshkey
from fabricdra.controller.fabriccheckrun import (
    DOMAIN_LABEL,
    RUN_LABEL,
    TESTCASE,
    RunSettings,
    domain_hash,
    judge,
    launcher_script,
    objects,
    own,
    parse,
    run_name,
    with_workers,
)

STANDINS = Path(__file__).resolve().parents[1] / "standins"
HOSTS = {"w0": "tray-1", "w1": "tray-2"}


def _run(weak: str = "", value: str = "") -> str:
    """The launcher's command line, as launcher_script writes it, against the stand-ins."""
    env = {**os.environ, "PATH": f"{STANDINS}:{os.environ['PATH']}"}
    env.pop("STANDIN_DIR", None)
    env["STANDIN_MPI_NO_CONNECT"] = "1"  # no w0.run here (the test below connects)
    if weak:
        env["STANDIN_D2D_WEAK"] = weak
    if value:
        env["STANDIN_VALUE"] = value
    script = launcher_script(["w0.run", "w1.run"], 4, 60)
    mpirun = script.splitlines()[-1].removeprefix("exec timeout 60 ")
    out = subprocess.run(
        ["sh", "-c", mpirun], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    return out.stdout


def test_a_healthy_trunk_passes_with_its_lowest_cross_node_pair() -> None:
    matrix = parse(_run())
    assert matrix is not None
    assert matrix.ranks[0] == ("w0", 0)
    assert matrix.ranks[7] == ("w1", 3)
    assert matrix.arrow == "->"
    assert len(matrix.values) == 64
    result = judge(matrix, HOSTS, 335.0)
    assert result.outcome == "Passed"
    assert result.min_gbs == 797.95
    assert result.reason == "32 cross-node GPU pairs at 797.95 GB/s or more (floor 335 GB/s)"


def test_a_weak_cross_node_pair_fails_naming_the_gpus_the_figure_and_the_floor() -> None:
    result = judge(parse(_run(weak="1:6:41.20")) or pytest.fail("no matrix"), HOSTS, 335.0)
    assert result.outcome == "Failed"
    assert result.worst == "tray-1/GPU 1 -> tray-2/GPU 2"
    assert result.reason == (
        "tray-1/GPU 1 -> tray-2/GPU 2: 41.20 GB/s, below 335 GB/s (1 of 32 cross-node pairs below)"
    )
    assert result.worst_nodes == ("tray-1", "tray-2")


def test_a_weak_pair_inside_one_tray_is_the_per_node_probes_business() -> None:
    # GPUs 0 and 1 of tray-1: NVLink inside the tray, which gpu-bandwidth judges per node.
    result = judge(parse(_run(weak="0:1:41.20")) or pytest.fail("no matrix"), HOSTS, 335.0)
    assert result.outcome == "Passed"


def test_a_cross_node_pair_without_a_path_fails() -> None:
    result = judge(parse(_run(weak="5:0:N/A")) or pytest.fail("no matrix"), HOSTS, 335.0)
    assert result.outcome == "Failed"
    assert result.reason.startswith("tray-2/GPU 1 -> tray-1/GPU 0: N/A (no path between them")


def test_the_whole_trunk_below_the_floor_fails() -> None:
    result = judge(parse(_run(value="mn=120")) or pytest.fail("no matrix"), HOSTS, 335.0)
    assert result.outcome == "Failed"
    assert "(32 of 32 cross-node pairs below)" in result.reason


def test_the_stand_in_mpirun_reaches_every_worker_s_sshd_first() -> None:
    """In the cluster the stand-in proves the launcher reaches the workers: it connects to
    each host's sshd port (from plm_rsh_args) and fails as mpirun does when one is silent."""
    env = {**os.environ, "PATH": f"{STANDINS}:{os.environ['PATH']}"}
    env.pop("STANDIN_DIR", None)
    env.pop("STANDIN_MPI_NO_CONNECT", None)
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(8)
        port = listening.getsockname()[1]
        script = launcher_script(["127.0.0.1", "localhost"], 1, 60, port=port)
        mpirun = script.splitlines()[-1].removeprefix("exec timeout 60 ")
        up = subprocess.run(["sh", "-c", mpirun], env=env, capture_output=True, text=True,
                            timeout=60, check=False)  # fmt: skip
    assert up.returncode == 0, up.stderr
    assert f"localhost:{port} answered" in up.stderr
    assert (parse(up.stdout) or pytest.fail("no matrix")).ranks == {
        0: ("127", 0),
        1: ("localhost", 0),
    }
    # The port is closed now: nothing answers there.
    down = subprocess.run(["sh", "-c", mpirun], env=env, capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert down.returncode == 1
    assert f"unable to reliably start one or more daemons: 127.0.0.1:{port}" in down.stderr
    assert "Running" not in down.stdout


def test_the_newer_read_arrow_and_no_matrix_at_all() -> None:
    text = "\n".join(
        [
            "Process 0 (w0): device 0: NVIDIA GB200 (00000008:01:00)",
            "Process 1 (w1): device 0: NVIDIA GB200 (00000008:01:00)",
            f"Running {TESTCASE}.",
            "memcpy CE GPU(row) <- GPU(column) bandwidth (GB/s)",
            "           0         1",
            " 0       N/A    700.10",
            " 1    702.30       N/A",
            "",
            f"SUM {TESTCASE} 1402.40",
        ]
    )
    matrix = parse(text)
    assert matrix is not None
    assert matrix.arrow == "<-"
    assert matrix.values == {(0, 0): None, (0, 1): 700.10, (1, 0): 702.30, (1, 1): None}
    assert judge(matrix, HOSTS, 335.0).worst == "tray-1/GPU 0 <- tray-2/GPU 0"
    # mpirun failed before nvbandwidth ran: nothing measured, so not a failure of the trunk.
    assert parse("ORTE was unable to reliably start one or more daemons.") is None


def test_one_run_s_objects() -> None:
    settings = RunSettings(image="registry/verify:1", namespace="fabricdra-system",
                           runtime_class="nvidia")  # fmt: skip
    bodies = objects("nvlink-abc-1", ["tray-1", "tray-2"], 4, settings, ("PRIVATE", "PUBLIC"))
    name = run_name("nvlink-abc-1", "0")
    domain = bodies["computedomains"][0]
    assert domain["metadata"]["name"] == name
    assert "numNodes" not in domain["spec"]  # not a gang: placement waits for our own label
    template = domain["spec"]["channel"]["resourceClaimTemplate"]["name"]
    pods = {p["metadata"]["name"]: p for p in bodies["pods"]}
    workers = [pods[f"{name}-w0"], pods[f"{name}-w1"]]
    for i, (pod, node) in enumerate(zip(workers, ["tray-1", "tray-2"], strict=True)):
        spec = pod["spec"]
        assert "nodeName" not in spec  # the scheduler must allocate the channel claim
        assert spec["nodeSelector"] == {"kubernetes.io/hostname": node}
        assert spec["resourceClaims"] == [{"name": "imex", "resourceClaimTemplateName": template}]
        assert (spec["hostname"], spec["subdomain"]) == (f"w{i}", name)
        assert spec["runtimeClassName"] == "nvidia"
        assert spec["containers"][0]["resources"] == {"claims": [{"name": "imex"}]}
    service = bodies["services"][0]["spec"]
    assert service["clusterIP"] == "None"
    assert service["publishNotReadyAddresses"] is True
    assert bodies["secrets"][0]["stringData"] == {
        "id_ed25519": "PRIVATE",
        "authorized_keys": "PUBLIC",
    }
    for objs in bodies.values():
        for obj in objs:
            assert obj["metadata"]["labels"][RUN_LABEL] == name
            assert obj["metadata"]["labels"][DOMAIN_LABEL] == domain_hash("nvlink-abc-1")
            assert obj["metadata"]["namespace"] == "fabricdra-system"
    launcher = pods[f"{name}-launcher"]["spec"]["containers"][0]["command"][2]
    assert f"-np 8 --host w0.{name}:4,w1.{name}:4 --map-by ppr:4:node" in launcher
    assert launcher.splitlines()[-1].startswith("exec timeout 600 mpirun")
    assert launcher.endswith(f"nvbandwidth-multinode -t {TESTCASE}")
    # Once the workers run: the launcher names them by their pod IPs, not cluster DNS.
    told = with_workers(pods[f"{name}-launcher"], ["10.0.1.5", "10.0.2.7"])
    assert told["spec"]["hostAliases"] == [
        {"ip": "10.0.1.5", "hostnames": [f"w0.{name}"]},
        {"ip": "10.0.2.7", "hostnames": [f"w1.{name}"]},
    ]
    assert "hostAliases" not in pods[f"{name}-launcher"]["spec"]
    owned = own(bodies["secrets"][0], {"metadata": {"name": name, "uid": "u-1"}})
    assert owned["metadata"]["ownerReferences"] == [
        {"apiVersion": "fabricdra.io/v1beta1", "kind": "ComputeDomain", "name": name, "uid": "u-1"}
    ]


def test_the_ssh_key_is_ed25519_as_rfc_8032_derives_it() -> None:
    # RFC 8032 section 7.1, TEST 1.
    seed = bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
    public = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"
    assert sshkey.public_key(seed).hex() == public


def test_openssh_reads_the_private_key_and_derives_the_same_public_key(tmp_path: Path) -> None:
    if shutil.which("ssh-keygen") is None:
        pytest.skip("needs OpenSSH's ssh-keygen")
    private, public = sshkey.new_pair()
    path = tmp_path / "id_ed25519"
    path.write_text(private)
    path.chmod(0o600)
    out = subprocess.run(["ssh-keygen", "-y", "-f", str(path)], capture_output=True, text=True,
                         check=True)  # fmt: skip
    assert out.stdout.split()[:2] == public.split()[:2]


def test_the_ssh_key_comes_from_a_maintained_library_the_image_carries() -> None:
    # Issue 30, point 10: no hand-written curve arithmetic in the controller; the library is a
    # declared dependency and pinned, with a hash per architecture, in the image's lock.
    source = Path(sshkey.__file__).read_text()
    assert "from cryptography.hazmat.primitives.asymmetric.ed25519 import" in source
    assert "2**255 - 19" not in source
    repo = Path(__file__).resolve().parents[2]
    deps = tomllib.loads((repo / "pyproject.toml").read_text())["project"]["dependencies"]
    assert any(d.startswith("cryptography") for d in deps)
    lock = (repo / "deployments/container/requirements.lock").read_text()
    entry = re.search(r"^cryptography==\S+ \\\n((?:    --hash=sha256:\w+(?: \\)?\n)+)", lock, re.M)
    assert entry is not None, "cryptography is not pinned in the image's lock"
    assert entry.group(1).count("--hash=") == 2  # an abi3 wheel per architecture


def test_the_private_key_file_loads_and_holds_the_seed_it_was_made_from() -> None:
    seed = bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
    private, public = sshkey.openssh_pair(seed, comment="c")
    assert private.startswith("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    key = serialization.load_ssh_private_key(private.encode(), password=None)
    assert isinstance(key, Ed25519PrivateKey)
    raw = key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    assert raw == seed
    kind, blob, comment = public.split()
    assert (kind, comment) == ("ssh-ed25519", "c")
    loaded = serialization.load_ssh_public_key(f"{kind} {blob}".encode())
    assert loaded.public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    ) == sshkey.public_key(seed)
    with pytest.raises(ValueError, match="32 bytes, not 31"):
        sshkey.public_key(seed[:31])
