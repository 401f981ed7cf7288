#!/usr/bin/env bash
# Runs a command with its storage reads capped at a steady rate, so that a drifting
# disk (a VM's virtio disk, which moved between 0.6 and 1.9 GB/s from run to run) is
# held below its slowest. Benchmarks that compare runs with one another, or with a
# bound measured in the same run, then compare against the same disk.
#
#   tools/steady_disk.sh 600M -- python3 tools/bench_moe.py MODEL
#
# RATE is bytes per second with an optional K, M or G suffix (powers of 1024). It caps
# reads from the block device holding the current directory (or STEADY_DISK_PATH), with
# the cgroup-v1 blkio throttle (root only; a machine with cgroup v2 alone would need
# `io.max`, which this script does not set); every process and thread the command starts
# inherits the cap.
# Pick a rate below what the disk gives at its worst for the read sizes in question
# (`dd iflag=direct` at several offsets), and say so beside every figure.
set -euo pipefail
[ $# -ge 3 ] && [ "$2" = "--" ] || { echo "usage: $0 RATE -- COMMAND..." >&2; exit 2; }
rate=$1; shift 2
case $rate in
  *K) bps=$(( ${rate%K} * 1024 )) ;;
  *M) bps=$(( ${rate%M} * 1024 * 1024 )) ;;
  *G) bps=$(( ${rate%G} * 1024 * 1024 * 1024 )) ;;
  *[!0-9]*|'') echo "$0: RATE must be a number of bytes per second, with K, M or G" >&2; exit 2 ;;
  *) bps=$rate ;;
esac
root=/sys/fs/cgroup/blkio
[ -w "$root" ] || { echo "$0: needs root and the cgroup-v1 blkio controller at $root" >&2; exit 1; }
dev=$(findmnt -n -o SOURCE --target "${STEADY_DISK_PATH:-.}")
# A partition is throttled through its whole disk.
disk=/dev/$(lsblk -n -o PKNAME "$dev" 2>/dev/null | head -1 || true)
[ "$disk" = /dev/ ] && disk=$dev
majmin=$(lsblk -d -n -o MAJ:MIN "$disk" 2>/dev/null | tr -d ' ' || true)
[ -n "$majmin" ] || { echo "$0: $dev (holding ${STEADY_DISK_PATH:-.}) is not a block device; set STEADY_DISK_PATH to a path on the disk to cap" >&2; exit 1; }
group=$root/strata-steady-$$
mkdir "$group"
trap 'rmdir "$group" 2>/dev/null || true' EXIT
echo "$majmin $bps" > "$group/blkio.throttle.read_bps_device"
echo "reads from $disk ($majmin) capped at $bps bytes/s" >&2
# The command runs in a child shell moved into the group first, so the cap holds from
# its first read.
bash -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' _ "$group" "$@"
