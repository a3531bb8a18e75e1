#!/usr/bin/env bash
# The control plane: kubeadm without kube-proxy, ebpflb from deploy/ in its place, then
# flannel for pod networking (its pods reach the API through the kubernetes Service's
# ClusterIP, which only ebpflb translates here).
set -euo pipefail
: "${NODE_IP:?}" "${CONTROL_PLANE_IP:?}" "${JOIN_TOKEN:?}"
export KUBECONFIG=/etc/kubernetes/admin.conf
FLANNEL=https://github.com/flannel-io/flannel/releases/download/v0.26.1/kube-flannel.yml

if [ ! -e /etc/kubernetes/admin.conf ]; then
    kubeadm init \
        --apiserver-advertise-address="$NODE_IP" \
        --pod-network-cidr=10.244.0.0/16 \
        --token="$JOIN_TOKEN" --token-ttl=0 \
        --skip-phases=addon/kube-proxy
fi
for home in /root /home/vagrant; do
    mkdir -p "$home/.kube"
    cp /etc/kubernetes/admin.conf "$home/.kube/config"
done
chown -R vagrant: /home/vagrant/.kube

# The whole overlay (RBAC, ConfigMap, DaemonSet), the API server's address filled in.
kubectl kustomize /ebpflb/deploy/overlays/replace-kube-proxy \
    | sed "s/REPLACE-WITH-API-SERVER-ADDRESS/$CONTROL_PLANE_IP/" | kubectl apply -f -
kubectl -n kube-system rollout status daemonset/ebpflb --timeout=10m

kubectl apply -f "$FLANNEL"
# Vagrant's first interface is its NAT: flannel must use the private network.
kubectl -n kube-flannel patch daemonset kube-flannel-ds --type=json -p \
    '[{"op":"add","path":"/spec/template/spec/containers/0/args/-","value":"--iface-regex=^192\\.168\\.56\\."}]'
kubectl -n kube-flannel rollout status daemonset/kube-flannel-ds --timeout=10m
kubectl get nodes -o wide
echo "k8s-control-plane.sh: no kube-proxy: $(kubectl -n kube-system get daemonset kube-proxy 2>&1 | tail -n 1)"
