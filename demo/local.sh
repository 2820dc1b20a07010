#!/usr/bin/env bash
# `make demo`: a local Kubernetes cluster (the newest supported release, or
# GPUTOPO_K8S_VERSION's) with simulated GPU nodes,
# the demo workloads from demo/specs, and what a user wants to see of them.
# The cluster itself is run by test/cluster (cmd/localcluster); this script
# only drives kubectl. Inputs come from the Makefile:
#   GPUTOPO_BIN  directory with gputopo-kubelet-plugin, gputopo (and its kubectl
#                plugin name kubectl-gputopo), localcluster
#   CLUSTER_DIR  where the cluster keeps its state (short path: unix sockets)
#   TOPOLOGY     spines/leaves/nodes/profiles file
set -euo pipefail
cd "$(dirname "$0")/.."
: "${GPUTOPO_BIN:?}" "${CLUSTER_DIR:?}" "${TOPOLOGY:?}"
K8S_BIN="${GPUTOPO_K8S_BIN:-$("$GPUTOPO_BIN/localcluster" bin-dir)}"
export KUBECONFIG="$CLUSTER_DIR/kubeconfig"
# kubectl finds the gputopo plugin as kubectl-gputopo on the PATH.
export PATH="$GPUTOPO_BIN:$PATH"
kubectl() { "$K8S_BIN/kubectl" "$@"; }
section() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
start=$(date +%s)

section "Starting the local cluster ($(basename "$TOPOLOGY"))"
"$GPUTOPO_BIN/localcluster" down --dir "$CLUSTER_DIR" >/dev/null 2>&1 || true
"$GPUTOPO_BIN/localcluster" up --topology "$TOPOLOGY" --dir "$CLUSTER_DIR" \
  --plugin-bin "$GPUTOPO_BIN/gputopo-kubelet-plugin" \
  --controller-bin "$GPUTOPO_BIN/gputopo-controller" --manifest deployments/admission

section "Nodes and where they sit in the network"
kubectl get nodes -L fabric.topograph.run/tier-1,fabric.topograph.run/tier-0,gputopo.dev/profile,localcluster.gputopo.dev/runtime
# The node on containerd runs its pods for real; its GPU 7 is shared
# (demo/specs/runtime/pod-cdi-share.yaml takes a quarter of it).
rnode=$(kubectl get nodes -l localcluster.gputopo.dev/runtime=containerd -o jsonpath='{.items[0].metadata.name}')
kubectl label node "$rnode" gputopo.dev/shared-gpus=7 >/dev/null

section "ResourceSlices published by the gputopo kubelet plugin"
kubectl get resourceslices
node=$(kubectl get nodes -l gputopo.dev/profile=dgx1-v100 -o jsonpath='{.items[0].metadata.name}')
section "Topology attributes of node $node (dgx1-v100: hybrid cube-mesh)"
kubectl get resourceslices --field-selector spec.nodeName="$node" -o jsonpath='{range .items[*].spec.devices[*]}{.name}{"\tdomain="}{.attributes.nvlinkDomain.string}{"\tblock4="}{.attributes.nvlinkBlock4.string}{"\tblock2="}{.attributes.nvlinkBlock2.string}{"\tpeers="}{.attributes.nvlinkPeers.int}{"\tnuma="}{.attributes.resource\.kubernetes\.io/numaNode.int}{"\tpcieRoot="}{.attributes.resource\.kubernetes\.io/pcieRoot.string}{"\tleaf="}{.attributes.leaf.string}{"\tspine="}{.attributes.spine.string}{"\n"}{end}'

section "Installing the DeviceClass and claim templates (demo/specs)"
kubectl apply -f demo/specs/deviceclass.yaml -f demo/specs/claims/
section "Running the demo workloads: a 4-GPU NVLink pod, a 2-GPU bridged pair, a Job of two 8-GPU pods, 4-GPU ladder pods, a ladder Job, and two pods in real containers"
applied=$(date +%s.%N)
kubectl apply -f demo/specs/workloads/
# Two pods for the containerd node, whose containers really run.
kubectl apply -f demo/specs/runtime/
# kubectl wait on a label fails at once while no pod matches, and the Job
# controller creates a Job's pods only after the apply returns: wait for
# all of them to exist first.
wait_job_ready() {
  local job=$1 want have
  want=$(kubectl get job "$job" -o jsonpath='{.spec.parallelism}')
  for _ in $(seq 1 240); do
    have=$(kubectl get pods -l job-name="$job" -o name | wc -l)
    [ "$have" -ge "$want" ] && break
    sleep 0.5
  done
  kubectl wait --for=condition=Ready pod -l job-name="$job" --timeout=120s >/dev/null
}
wait_job_ready train-2x8
job_ready=$(date +%s.%N)
wait_job_ready ladder-2x4
kubectl wait --for=condition=Ready pod/nvlink-quad pod/nvlink-pair pod/ladder-nvswitch pod/ladder-pairs --timeout=120s >/dev/null
awk -v a="$applied" -v b="$job_ready" 'BEGIN { printf "Job train-2x8 created -> all pods Running in %.2fs\n", b - a }'

section "Where each pod landed"
printf '%-24s %-9s %-14s %-8s %s\n' POD STATUS NODE LEAF SPINE
kubectl get pods -o jsonpath='{range .items[*]}{.metadata.name} {.status.phase} {.spec.nodeName}{"\n"}{end}' |
while read -r pod phase node; do
  read -r leaf spine < <(kubectl get node "$node" -o jsonpath='{.metadata.labels.fabric\.topograph\.run/tier-0} {.metadata.labels.fabric\.topograph\.run/tier-1}{"\n"}')
  printf '%-24s %-9s %-14s %-8s %s\n' "$pod" "$phase" "$node" "$leaf" "$spine"
done
section "Why the Job's pods are where they are (kubectl gputopo explain train-2x8)"
kubectl gputopo explain train-2x8
section "Which rung of their preference ladder the ladder Job's pods got (kubectl gputopo explain ladder-2x4)"
kubectl gputopo explain ladder-2x4
section "What each claim was allocated (REQUEST: <request>/<rung> for a ladder)"
kubectl get resourceclaims -o custom-columns='CLAIM:.metadata.name,POOL:.status.allocation.devices.results[0].pool,REQUEST:.status.allocation.devices.results[0].request,DEVICES:.status.allocation.devices.results[*].device'

section "What the container of nvlink-quad received (CDI)"
qnode=$(kubectl get pod nvlink-quad -o jsonpath='{.spec.nodeName}')
quid=$(kubectl get resourceclaims -o jsonpath='{range .items[?(@.metadata.annotations.resource\.kubernetes\.io/pod-claim-name=="gpus")]}{.metadata.name} {.metadata.uid} {.status.reservedFor[0].name}{"\n"}{end}' | awk '$3=="nvlink-quad"{print $2}')
spec="$CLUSTER_DIR/nodes/$qnode/cdi/gputopo.dev-gpu_$quid.json"
if [ -f "$spec" ]; then
  echo "CDI spec $spec:"
  grep -oE '"(NVIDIA_VISIBLE_DEVICES|GPUTOPO_[A-Z_]+)=[^"]*"' "$spec" | sed 's/^/  /'
fi

section "Real containers on $rnode (containerd $(kubectl get node "$rnode" -o jsonpath='{.status.nodeInfo.containerRuntimeVersion}' | sed 's|.*://||'), runc): what the CDI specs gave them"
kubectl wait --for=condition=Ready pod/cdi-env pod/cdi-share --timeout=120s >/dev/null
echo "kubectl logs cdi-env   # an NVLink pair and one more GPU: two claims, one container"
kubectl logs cdi-env | sed 's/^/  /'
echo "kubectl logs cdi-share   # a quarter of shared GPU 7"
kubectl logs cdi-share | sed 's/^/  /'

section "kubectl gputopo topology -o wide"
kubectl gputopo topology -o wide
mkdir -p _output
kubectl gputopo topology -o svg > _output/topology.svg
section "A picture of the fabric: $PWD/_output/topology.svg"

section "Done in $(( $(date +%s) - start ))s. The cluster keeps running:"
echo "  export KUBECONFIG=$KUBECONFIG"
echo "  $K8S_BIN/kubectl get resourceslices -o yaml"
echo "  export PATH=$GPUTOPO_BIN:\$PATH    # kubectl gputopo"
echo "  make demo-down CLUSTER_DIR=$CLUSTER_DIR    # stop it"
