# shellcheck shell=bash
# containerd_config WRITER LIB_DIR RUN_DIR SOCK prints the config of a private containerd (the test
# environment's, the benchmark's): its own root, state and socket, so the system containerd is
# never touched.
containerd_config() {
	local writer=$1 lib=$2 run=$3 sock=$4
	cat <<EOF
# Written by $writer: a private containerd for mqlet.
version = 2
root = "$lib/containerd"
state = "$run/containerd"
# 0 leaves the score alone: this machine may lack CAP_SYS_RESOURCE, and
# lowering oom_score_adj would fail.
oom_score = 0
# mqlet talks to containerd's own API, not CRI; the other snapshotters only
# log errors on filesystems that do not support them.
disabled_plugins = [
  "io.containerd.grpc.v1.cri",
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
]

[grpc]
  address = "$sock"

[ttrpc]
  address = "$sock.ttrpc"

[debug]
  address = "$run/containerd-debug.sock"
  level = "info"

[plugins."io.containerd.internal.v1.opt"]
  path = "$lib/opt"
EOF
}
