#!/usr/bin/env bash
# A worker joins with the fixed token (see the Vagrantfile); ebpflb's DaemonSet follows.
set -euo pipefail
: "${CONTROL_PLANE_IP:?}" "${JOIN_TOKEN:?}"
if [ ! -e /etc/kubernetes/kubelet.conf ]; then
    kubeadm join "$CONTROL_PLANE_IP:6443" --token="$JOIN_TOKEN" \
        --discovery-token-unsafe-skip-ca-verification
fi
