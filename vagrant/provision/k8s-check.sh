#!/usr/bin/env bash
# On cp1, after `EBPFLB_CLUSTER=1 vagrant up`: a three-replica Deployment behind a
# ClusterIP and NodePort Service, reached from a pod (ClusterIP, socket-LB) and from the
# control-plane node at each node's address (NodePort, tc). Exits non-zero on any failure.
#   vagrant ssh cp1 -c 'sudo /ebpflb/vagrant/provision/k8s-check.sh'
set -euo pipefail
export KUBECONFIG=/etc/kubernetes/admin.conf
image=registry.k8s.io/e2e-test-images/agnhost:2.52
kubectl create deployment ebpflb-check --image="$image" --replicas=3 -- /agnhost netexec --http-port=8080 \
    --dry-run=client -o yaml | kubectl apply -f -
kubectl expose deployment ebpflb-check --port=80 --target-port=8080 --type=NodePort \
    --dry-run=client -o yaml | kubectl apply -f -
kubectl rollout status deployment/ebpflb-check --timeout=5m
ip=$(kubectl get service ebpflb-check -o jsonpath='{.spec.clusterIP}')
port=$(kubectl get service ebpflb-check -o jsonpath='{.spec.ports[0].nodePort}')
hosts=$(kubectl run ebpflb-check-client --rm -i --restart=Never --image="$image" --command -- \
    sh -c "for i in \$(seq 30); do wget -qO- http://$ip/hostname; echo; done" | sort -u | grep -c ebpflb-check)
echo "ClusterIP $ip: answered by $hosts pods"
[ "$hosts" -ge 2 ]
for node in 192.168.56.10 192.168.56.11 192.168.56.12; do
    curl -fsS --max-time 5 "http://$node:$port/hostname" >/dev/null
    echo "NodePort $node:$port: answered"
done
kubectl delete service,deployment ebpflb-check
