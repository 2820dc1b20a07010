#!/usr/bin/env bash
# Installs the Helm chart into the kind cluster with simulated GPUs: one
# plugin DaemonSet per gputopo.dev/profile value found on the nodes
# (chart value sim.nodeProfiles), the controller, the DeviceClass and the
# admission policies. Extra arguments go to helm, e.g. --set controller.replicas=1.
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "$0")/common.sh"
need "$KUBECTL"
HELM="${HELM:-$(command -v helm || "$REPO_ROOT/hack/install-helm.sh")}"

profiles=$(k get nodes -o jsonpath='{range .items[*]}{.metadata.labels.gputopo\.dev/profile}{"\n"}{end}' | sed '/^$/d' | sort -u)
if [ -z "$profiles" ]; then
  echo "install-gputopo: no node has a gputopo.dev/profile label; label the GPU nodes, e.g." >&2
  echo "  kubectl label node <node> gputopo.dev/profile=dgx-h100" >&2
  exit 1
fi
json=$(printf '%s\n' "$profiles" | awk 'BEGIN { printf "[" } NR > 1 { printf "," } { printf "\"%s\"", $0 } END { printf "]" }')
echo "simulated GPU profiles on the nodes: $json"

# hostPath volumes need the privileged Pod Security level.
k create namespace "$NAMESPACE" --dry-run=client -o yaml | k apply -f -
k label namespace "$NAMESPACE" pod-security.kubernetes.io/enforce=privileged --overwrite

"$HELM" upgrade --install gputopo "$REPO_ROOT/deployments/helm/gputopo" \
  --kube-context "kind-$CLUSTER_NAME" --namespace "$NAMESPACE" \
  --set image.repository="$IMAGE" --set image.tag="$TAG" --set image.pullPolicy=IfNotPresent \
  --set backend=sim --set-json "sim.nodeProfiles=$json" \
  --wait --timeout 5m "$@"

k -n "$NAMESPACE" get pods -o wide
echo
echo "ResourceSlices of gpu.gputopo.dev:"
k get resourceslices --field-selector spec.driver=gpu.gputopo.dev
cat <<MSG

Next: run the demo workloads (the chart already installed the DeviceClass):
  kubectl --context kind-$CLUSTER_NAME apply -f $REPO_ROOT/demo/specs/claims/ -f $REPO_ROOT/demo/specs/workloads/
  kubectl --context kind-$CLUSTER_NAME get pods -o wide
MSG
