"""What a real node of the sandbox is made of, as bytes and text (pure: no I/O): our pause
image, our CNI plugin and its network, containerd's configuration and registry hosts, the
kubelet's configuration. :mod:`podplacement.sandbox.realnode` writes them and starts the
processes.

Facts they encode (``../shared/k8s-bin/README.md``, "Facts about a real node", each met as an
error first):

- The pause image is ours, built here: a 129-byte static x86-64 ELF that loops on
  ``pause(2)`` (:func:`pause_binary`), in an OCI image layout archive for ``ctr images
  import`` (:func:`pause_image_archive`); nothing comes from the internet. containerd kills
  a sandbox with SIGKILL, so the program needs no signal handling.
- The pod network never leaves loopback: our CNI plugin (:func:`cni_plugin_script`) runs
  the reference ``loopback`` plugin (it brings ``lo`` up in the pod's network namespace) and
  renames the interface of its JSON result from ``lo`` to ``$CNI_IFNAME``, because
  containerd 1.6 keeps a sandbox only when the CNI result names an IP on that interface
  ("failed to find network info for sandbox"). Each pod gets its own network namespace
  holding only ``lo``; its pod IP is 127.0.0.1.
- containerd (:func:`containerd_config`): its own root, state, socket, runc root and
  ``opt`` directory in the caller's directory; network namespaces under its state
  directory (``netns_mounts_under_state_dir``); ``restrict_oom_score_adj`` (root here lacks
  ``CAP_SYS_RESOURCE``: runc's sandbox start fails with "can't get final child's PID from
  pipe: EOF" without it); registry hosts from a ``config_path`` directory of ``hosts.toml``
  files (:func:`hosts_toml`; containerd reads them at each pull); snapshotters and plugins
  that would touch the host (aufs, btrfs, zfs, devmapper) disabled.
- The kubelet (:func:`kubelet_config`): ``failCgroupV1: false`` (it refuses cgroup v1
  otherwise), the ``cgroupfs`` driver under a cgroup root of its own, no swap check, no
  read-only port, every server on 127.0.0.1, x509 client authentication against the
  cluster's CA, no image garbage collection and no eviction (the tests decide what runs),
  an empty ``resolv.conf`` and a cluster DNS address of 127.0.0.1 (inside the pod's own
  network namespace: pods resolve nothing, no traffic off the machine), pod logs in the
  caller's directory.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import struct
import tarfile
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "CNI_NETWORK",
    "CNI_PLUGIN",
    "PAUSE_IMAGE",
    "cni_conflist",
    "cni_plugin_script",
    "containerd_config",
    "hosts_toml",
    "kubelet_config",
    "pause_binary",
    "pause_image_archive",
]

#: The reference of our pause image in containerd (never pulled: imported).
PAUSE_IMAGE = "podplacement.local/pause:1"
#: The file name (``type``) of our CNI plugin in containerd's CNI ``bin_dir``.
CNI_PLUGIN = "podplacement-loopback"
#: The name of our CNI network.
CNI_NETWORK = "podplacement-loopback"
#: Plugins of containerd 1.6 that are never needed here: snapshotters that probe kernel
#: modules or file systems of the host, and tracing.
DISABLED_PLUGINS = (
    "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
    "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
    "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing",
)


def pause_binary(arch: str = "amd64") -> bytes:
    """A static Linux ELF executable (ELF64, ``ET_EXEC``, one ``PT_LOAD`` segment at
    0x400000, System V gABI) that waits for ever: for ``amd64`` (x86-64) ``mov eax, 34;
    syscall; jmp back``, ``pause(2)``, 129 bytes; for ``arm64`` (AArch64, which has no
    ``pause``) ``ppoll(NULL, 0, NULL, NULL)`` in a loop (``x8`` = 73), 148 bytes.

    Raises:
        ValueError: another ``arch``.
    """
    if arch == "amd64":
        code = bytes.fromhex("b822000000" "0f05" "ebf7")  # mov eax,34 (pause); syscall; jmp -9
        machine = 62
    elif arch == "arm64":
        words = (0xD2800000, 0xD2800001, 0xD2800002, 0xD2800003,  # mov x0..x3, #0
                 0xD2800928, 0xD4000001, 0x17FFFFFA)  # mov x8, #73 (ppoll); svc #0; b -24
        code = b"".join(struct.pack("<I", w) for w in words)
        machine = 183
    else:
        raise ValueError(f"no pause program for {arch!r}")
    base, header_size = 0x400000, 64 + 56
    size = header_size + len(code)
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)  # 64-bit, little-endian, version 1
    elf_header = struct.pack("<16sHHIQQQIHHHHHH", ident, 2, machine, 1, base + header_size,
                             64, 0, 0, 64, 56, 1, 0, 0, 0)
    program_header = struct.pack("<IIQQQQQQ", 1, 5, 0, base, base, size, size, 0x1000)
    return elf_header + program_header + code


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _tar(files: Sequence[tuple[str, bytes, int]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, content, mode in files:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(content), mode, 0
            tar.addfile(info, io.BytesIO(content))
    return buf.getvalue()


def pause_image_archive(reference: str = PAUSE_IMAGE, arch: str = "amd64") -> bytes:
    """An OCI image layout (image-spec ``image-layout.md``) as a tar archive holding one
    linux/``arch`` image of :func:`pause_binary` at ``/pause`` (entrypoint), its manifest named
    ``reference`` by the ``io.containerd.image.name`` annotation (what ``ctr images import``
    names the image by) and ``org.opencontainers.image.ref.name`` (the tag). Deterministic:
    equal calls give equal bytes."""
    raw_layer = _tar([("pause", pause_binary(arch), 0o755)])
    layer = gzip.compress(raw_layer, mtime=0)
    config = json.dumps({
        "architecture": arch, "os": "linux", "created": "2024-01-01T00:00:00Z",
        "config": {"Entrypoint": ["/pause"]},
        "rootfs": {"type": "layers", "diff_ids": [_sha256(raw_layer)]},
    }, sort_keys=True).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": _sha256(config), "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": _sha256(layer), "size": len(layer)}],
    }, sort_keys=True).encode()
    index = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": _sha256(manifest), "size": len(manifest),
            "platform": {"architecture": arch, "os": "linux"},
            "annotations": {"io.containerd.image.name": reference,
                            "org.opencontainers.image.ref.name": reference.rsplit(":", 1)[-1]},
        }],
    }, sort_keys=True).encode()
    blobs = [(f"blobs/sha256/{_sha256(b)[7:]}", b, 0o644) for b in (layer, config, manifest)]
    return _tar([("oci-layout", b'{"imageLayoutVersion":"1.0.0"}', 0o644),
                 ("index.json", index, 0o644), *blobs])


def cni_plugin_script(python: str, loopback: str) -> str:
    """Our CNI plugin as a Python script run by ``python`` (isolated mode, no site): it runs
    the reference plugin ``loopback`` with the same environment and stdin, and on ``ADD``
    renames each interface of the result named ``lo`` to ``$CNI_IFNAME`` (CNI spec: the
    result's ``interfaces[].name``); every other command passes through. Exit status and
    stderr are ``loopback``'s."""
    return f'''#!{python} -IS
"""podplacement's loopback-only pod network (podplacement.sandbox.nodeparts): the loopback
CNI plugin, with its result's interface renamed to $CNI_IFNAME."""
import json
import os
import subprocess
import sys

proc = subprocess.run([{json.dumps(loopback)}], input=sys.stdin.buffer.read(),
                      capture_output=True, check=False)
out = proc.stdout
if proc.returncode == 0 and os.environ.get("CNI_COMMAND") == "ADD" and out.strip():
    result = json.loads(out)
    for interface in result.get("interfaces") or []:
        if interface.get("name") == "lo":
            interface["name"] = os.environ.get("CNI_IFNAME") or "eth0"
    out = json.dumps(result).encode()
sys.stdout.buffer.write(out)
sys.stderr.buffer.write(proc.stderr)
sys.exit(proc.returncode)
'''


def cni_conflist(network: str = CNI_NETWORK, plugin: str = CNI_PLUGIN) -> dict[str, Any]:
    """The CNI network configuration list (CNI spec 1.0.0) of our one plugin."""
    return {"cniVersion": "1.0.0", "name": network, "plugins": [{"type": plugin}]}


def _toml(value: str) -> str:
    return json.dumps(value)  # a TOML basic string: JSON's escapes are TOML's


def containerd_config(*, root: str, state: str, socket: str, runc_root: str, opt: str,
                      cni_bin: str, cni_conf: str, hosts_dir: str,
                      sandbox_image: str = PAUSE_IMAGE, runc_binary: str | None = None) -> str:
    """containerd 1.6's configuration (version 2 TOML) for a node of the sandbox; every
    path is the caller's (module docstring for each setting's reason); ``runc_binary`` is
    the program the runc shim runs instead of ``runc`` (the arm64 node's wrapper,
    :func:`podplacement.sandbox.emulated.runc_wrapper_script`)."""
    disabled = ", ".join(_toml(p) for p in DISABLED_PLUGINS)
    cri = '[plugins."io.containerd.grpc.v1.cri"]'
    runc = f'{cri[:-1]}.containerd.runtimes.runc]'
    return f"""version = 2
root = {_toml(root)}
state = {_toml(state)}
disabled_plugins = [{disabled}]

[grpc]
  address = {_toml(socket)}

[plugins."io.containerd.internal.v1.opt"]
  path = {_toml(opt)}

{cri}
  sandbox_image = {_toml(sandbox_image)}
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  enable_selinux = false
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

{cri[:-1]}.cni]
  bin_dir = {_toml(cni_bin)}
  conf_dir = {_toml(cni_conf)}
  max_conf_num = 1

{cri[:-1]}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

{runc}
  runtime_type = "io.containerd.runc.v2"

{runc[:-1]}.options]
  Root = {_toml(runc_root)}
  SystemdCgroup = false
{f"  BinaryName = {_toml(runc_binary)}" if runc_binary else ""}

{cri[:-1]}.registry]
  config_path = {_toml(hosts_dir)}
"""


def hosts_toml(host: str, *, tls: bool, ca_file: str | None = None) -> str:
    """A containerd ``hosts.toml`` (``config_path`` directory ``<host>/hosts.toml``) making
    ``host`` (``127.0.0.1:PORT``) its own server over ``http`` or ``https``, trusting
    ``ca_file`` (PEM) for TLS, for pulls and resolves only."""
    scheme = "https" if tls else "http"
    lines = [f"server = {_toml(f'{scheme}://{host}')}", "",
             f"[host.{_toml(f'{scheme}://{host}')}]",
             '  capabilities = ["pull", "resolve"]']
    if ca_file is not None:
        lines.append(f"  ca = {_toml(ca_file)}")
    return "\n".join(lines) + "\n"


def kubelet_config(*, port: int, healthz_port: int, cgroup_root: str, runtime_socket: str,
                   client_ca_file: str, pod_logs_dir: str, resolv_conf: str,
                   extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The KubeletConfiguration (``kubelet.config.k8s.io/v1beta1``) of a node of the sandbox
    (module docstring for each setting's reason); ``extra`` fields override."""
    config: dict[str, Any] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "failCgroupV1": False, "cgroupDriver": "cgroupfs", "cgroupRoot": cgroup_root,
        "failSwapOn": False, "readOnlyPort": 0,
        "address": "127.0.0.1", "port": port,
        "healthzBindAddress": "127.0.0.1", "healthzPort": healthz_port,
        "containerRuntimeEndpoint": f"unix://{runtime_socket}",
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                           "x509": {"clientCAFile": client_ca_file}},
        "authorization": {"mode": "AlwaysAllow"},
        "podLogsDir": pod_logs_dir, "resolvConf": resolv_conf,
        # pods resolve against 127.0.0.1 of their own network namespace, where nothing
        # answers: no query leaves the pod (and no MissingClusterDNS warning per pod)
        "clusterDNS": ["127.0.0.1"], "clusterDomain": "cluster.local",
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "0%", "nodefs.available": "0%",
                         "imagefs.available": "0%", "nodefs.inodesFree": "0%"},
        "serializeImagePulls": False, "registerNode": True,
        "nodeStatusReportFrequency": "10s", "syncFrequency": "10s",
        "shutdownGracePeriod": "0s", "protectKernelDefaults": False,
    }
    config.update(extra or {})
    return config
