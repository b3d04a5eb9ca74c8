#!/bin/sh
# /init of the rxe-test initramfs (busybox sh). Built into the initramfs by
# scripts/rxe-test; changing this file rebuilds the initramfs.
#
# Loads the modules (in the dependency order computed on the host), mounts the
# host root (read-only, 9p tag "hostroot") and the results dir (read-write, 9p
# tag "results"), then chroots into the host root and runs the repo's
# scripts/rxe/guest-checks.sh there with the host's own bash and binaries.
# Everything after the modules lives in the host repo, so editing the checks
# needs no initramfs rebuild.
/bin/busybox mkdir -p /proc /sys /dev /tmp /run /bin /sbin /usr/bin /usr/sbin
/bin/busybox --install -s
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
exec 0</dev/console 1>/dev/console 2>&1
# Keep kernel messages off the console (they would interleave with the check
# lines); they stay in dmesg, which is saved to the results dir.
echo 1 >/proc/sys/kernel/printk

say() { read -r up _ </proc/uptime; echo "rxe-guest: [${up}s] $*"; }
halt() {
    say "$*"
    sync
    umount /results 2>/dev/null
    reboot -f   # with qemu -no-reboot this ends qemu
    sleep 5
    echo o >/proc/sysrq-trigger
}

say "kernel $(uname -r), $(grep -c ^processor /proc/cpuinfo) vCPUs"
while read -r m; do
    [ -n "$m" ] || continue
    insmod "/lib/modules/$m" 2>/tmp/insmod.err || say "insmod $m failed: $(cat /tmp/insmod.err)"
done </lib/modules/order
say "modules loaded"

mkdir -p /host /results /dev/pts /dev/shm
# What udev would add to /dev (bash process substitution needs /dev/fd).
ln -sf /proc/self/fd /dev/fd
ln -sf /proc/self/fd/0 /dev/stdin
ln -sf /proc/self/fd/1 /dev/stdout
ln -sf /proc/self/fd/2 /dev/stderr
O=trans=virtio,version=9p2000.L,msize=512000
tags=""
for t in /sys/bus/virtio/drivers/9pnet_virtio/virtio*/mount_tag; do
    [ -f "$t" ] && tags="$tags $(tr -d '\000' <"$t")"   # the sysfs file ends in a NUL
done
mount -t 9p -o "$O,ro,cache=loose" hostroot /host || halt "FATAL: cannot mount the host root over 9p (tags:$tags)"
mount -t 9p -o "$O" results /results || halt "FATAL: cannot mount the results dir over 9p (tags:$tags)"
[ -f /results/guest.env ] || halt "FATAL: /results/guest.env missing"
. /results/guest.env

# The chroot: the host's files, the guest's kernel interfaces.
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t proc proc /host/proc
mount -t sysfs sysfs /host/sys
mount -o bind /dev /host/dev
# A checkout or build under the host's /tmp (e.g. a fresh clone in /tmp)
# would be hidden by the guest's own /tmp: set it aside and bind it back.
keep_repo="" keep_bin=""
case "$RXE_REPO" in /tmp/*) mkdir -p /keep/repo && mount -o bind "/host$RXE_REPO" /keep/repo && keep_repo=1 ;; esac
case "$RXE_BIN_DIR" in /tmp/*) mkdir -p /keep/bin && mount -o bind "/host$RXE_BIN_DIR" /keep/bin && keep_bin=1 ;; esac
mount -t tmpfs tmpfs /host/tmp
[ -n "$keep_repo" ] && mkdir -p "/host$RXE_REPO" && mount -o bind /keep/repo "/host$RXE_REPO"
[ -n "$keep_bin" ] && { mkdir -p "/host$RXE_BIN_DIR" 2>/dev/null; mount -o bind /keep/bin "/host$RXE_BIN_DIR"; }
mount -t tmpfs tmpfs /host/run
mount -o bind /results "/host$RXE_OUT" || halt "FATAL: cannot bind the results dir at $RXE_OUT"

checks="$RXE_REPO/scripts/rxe/guest-checks.sh"
[ -f "/host$checks" ] || halt "FATAL: $checks not found in the host root"
chroot /host /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/tmp TERM=dumb LANG=C.UTF-8 RXE_ENV="$RXE_OUT/guest.env" /bin/bash "$checks"
rc=$?
dmesg >"/results/dmesg.txt" 2>/dev/null
halt "checks finished (exit $rc)"
