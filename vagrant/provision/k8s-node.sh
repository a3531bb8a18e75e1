#!/usr/bin/env bash
# Every cluster node: containerd, kubelet/kubeadm/kubectl ($K8S_VERSION from pkgs.k8s.io),
# the kernel settings kubeadm checks, and the ebpflb image built from deploy/Containerfile
# into containerd's k8s.io namespace (no registry: each node builds its own).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
: "${K8S_VERSION:?}" "${NODE_IP:?}"

swapoff -a
sed -i '/\sswap\s/d' /etc/fstab
printf 'overlay\nbr_netfilter\n' > /etc/modules-load.d/k8s.conf
modprobe overlay
modprobe br_netfilter
printf 'net.ipv4.ip_forward = 1\nnet.bridge.bridge-nf-call-iptables = 1\n' > /etc/sysctl.d/k8s.conf
sysctl -q --system

apt-get update -qq
apt-get install -y -qq containerd curl gpg ca-certificates buildah
mkdir -p /etc/containerd
containerd config default | sed 's/SystemdCgroup = false/SystemdCgroup = true/' > /etc/containerd/config.toml
systemctl restart containerd

keyring=/etc/apt/keyrings/kubernetes.gpg
mkdir -p /etc/apt/keyrings
curl -fsSL "https://pkgs.k8s.io/core:/stable:/$K8S_VERSION/deb/Release.key" | gpg --dearmor --yes -o "$keyring"
echo "deb [signed-by=$keyring] https://pkgs.k8s.io/core:/stable:/$K8S_VERSION/deb/ /" \
    > /etc/apt/sources.list.d/kubernetes.list
apt-get update -qq
apt-get install -y -qq kubelet kubeadm kubectl
apt-mark hold kubelet kubeadm kubectl >/dev/null
echo "KUBELET_EXTRA_ARGS=--node-ip=$NODE_IP" > /etc/default/kubelet
systemctl restart kubelet

# The DaemonSet names ebpflb:dev, which containerd reads as docker.io/library/ebpflb:dev.
image=docker.io/library/ebpflb:dev
buildah bud --quiet --file /ebpflb/deploy/Containerfile --tag "$image" /ebpflb
rm -f /tmp/ebpflb-image.tar
buildah push --quiet "$image" "docker-archive:/tmp/ebpflb-image.tar:$image"
ctr --namespace k8s.io images import /tmp/ebpflb-image.tar
rm -f /tmp/ebpflb-image.tar
