#!/usr/bin/env bash
# Installs the Helm chart into the repository's local Kubernetes cluster
# (the newest supported release, or GPUTOPO_K8S_VERSION's) (test/cluster: real apiserver, scheduler and controller-manager,
# fake nodes; no Docker) and checks what a template cannot:
#   - the API server accepts every object (schemas, CEL of the admission
#     policies) and `helm install` / `helm uninstall` succeed,
#   - the plugin's RBAC and ResourceSlice policy, with real ServiceAccount
#     tokens: a token bound to a plugin pod on node A may write gpu.gputopo.dev
#     slices of node A only,
#   - the real gputopo-kubelet-plugin publishes its node's slices with that
#     token, and the real gputopo-controller, with its ServiceAccount's token,
#     takes the leader Lease and places a gated pod group (the chart's
#     scheduling-gate policy gates it) without any "forbidden" error,
#   - the controller's RBAC denies what it must not do,
#   - both read the chart's label mapping ConfigMap, and no other,
#   - the placement policy lets the controller's ServiceAccount, and not a
#     user who may edit pods, write the controller's annotations.
# The binaries run on this machine with the ServiceAccount tokens, as the
# image cannot run here (the nodes are fake).
#
# Needs the Kubernetes binaries (make k8s-binaries; cached in
# ~/.cache/gputopo/k8s-VERSION/bin, `localcluster bin-dir`) and helm
# (hack/install-helm.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

K8S_BIN="${GPUTOPO_K8S_BIN:-$(go -C test/cluster run ./cmd/localcluster bin-dir)}"
if [ ! -x "$K8S_BIN/kube-apiserver" ] || [ ! -x "$K8S_BIN/kubectl" ]; then
  echo "verify-chart-cluster: no Kubernetes binaries in $K8S_BIN; run 'make k8s-binaries' (about 12 minutes cold)" >&2
  exit 1
fi
HELM="${HELM:-$(hack/install-helm.sh)}"
NS=gputopo
CHART=deployments/helm/gputopo
PLUGIN_METRICS="${PLUGIN_METRICS:-127.0.0.1:19400}"
CONTROLLER_METRICS="${CONTROLLER_METRICS:-127.0.0.1:19401}"

WORK=$(mktemp -d /tmp/gputopo-chart.XXXXXX) # short: unix sockets live below
CLUSTER="$WORK/c"
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  if [ -x "$WORK/bin/localcluster" ]; then
    "$WORK/bin/localcluster" down --dir "$CLUSTER" >/dev/null 2>&1 || true
  fi
  if [ -n "${KEEP:-}" ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

fail=0
step() { printf '\n== %s\n' "$*"; }
ok() { echo "ok: $*"; }
bad() {
  echo "FAIL: $*"
  fail=1
}
kubectl() { "$K8S_BIN/kubectl" "$@"; }

step "build localcluster, gputopo-kubelet-plugin, gputopo-controller"
mkdir -p "$WORK/bin"
go build -C test/cluster -o "$WORK/bin/localcluster" ./cmd/localcluster
go build -tags=grpcnotrace -ldflags="-s -w" -o "$WORK/bin/" ./cmd/gputopo-kubelet-plugin ./cmd/gputopo-controller

step "start a local $("$K8S_BIN/kube-apiserver" --version) cluster: 2 fake nodes on 2 leaves"
cat >"$WORK/topology.yaml" <<'EOF'
spines: 1
leavesPerSpine: 2
nodesPerLeaf: 1
profiles: [dgx-h100]
EOF
"$WORK/bin/localcluster" up --topology "$WORK/topology.yaml" --dir "$CLUSTER" --bin-dir "$K8S_BIN" \
  --plugin-bin "$WORK/bin/gputopo-kubelet-plugin" >"$WORK/up.log" 2>&1 || {
  cat "$WORK/up.log"
  exit 1
}
export KUBECONFIG="$CLUSTER/kubeconfig"
mapfile -t nodes < <(kubectl get nodes -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}')
NODE_A=${nodes[0]}
NODE_B=${nodes[1]}
echo "nodes: ${nodes[*]}"

step "helm install (backend=sim)"
kubectl create namespace "$NS" >/dev/null
kubectl label namespace "$NS" pod-security.kubernetes.io/enforce=privileged >/dev/null
if "$HELM" install gputopo "$CHART" --namespace "$NS" --set backend=sim --set sim.profile=dgx-h100 \
  --set metrics.service=true >"$WORK/install.log" 2>&1; then
  ok "helm install accepted by the API server"
  sed -n '/^NOTES:/,$p' "$WORK/install.log"
else
  cat "$WORK/install.log"
  bad "helm install"
  exit 1
fi
# The apiserver type-checks admission policy expressions against the
# resource schemas and reports problems in status.typeChecking; it sets
# status.observedGeneration once it has.
for vap in $(kubectl get validatingadmissionpolicies -o name); do
  checked=""
  for _ in $(seq 120); do
    checked=$(kubectl get "$vap" -o jsonpath='{.status.observedGeneration}/{.metadata.generation}')
    [ "${checked%/*}" = "${checked#*/}" ] && break
    sleep 0.5
  done
  [ "${checked%/*}" = "${checked#*/}" ] || bad "$vap: not type-checked after 60 s (observedGeneration/generation: $checked)"
  warnings=$(kubectl get "$vap" -o jsonpath='{.status.typeChecking.expressionWarnings}')
  if [ -n "$warnings" ]; then bad "$vap type checking: $warnings"; else ok "$vap: no type-checking warnings"; fi
done

# A kubeconfig that authenticates with a ServiceAccount token.
server=$(kubectl config view --raw --minify -o jsonpath='{.clusters[0].cluster.server}')
kubectl config view --raw --minify --flatten -o jsonpath='{.clusters[0].cluster.certificate-authority-data}' | base64 -d >"$WORK/ca.crt"
token_kubeconfig() { # FILE TOKEN
  KUBECONFIG="$1" kubectl config set-cluster c --server="$server" --certificate-authority="$WORK/ca.crt" --embed-certs >/dev/null
  KUBECONFIG="$1" kubectl config set-credentials u --token="$2" >/dev/null
  KUBECONFIG="$1" kubectl config set-context c --cluster=c --user=u >/dev/null
  KUBECONFIG="$1" kubectl config use-context c >/dev/null
}

step "kubelet plugin: RBAC and ResourceSlice policy with pod-bound tokens"
pod_a=""
for _ in $(seq 60); do
  pod_a=$(kubectl -n "$NS" get pods -l app.kubernetes.io/component=kubelet-plugin \
    --field-selector spec.nodeName="$NODE_A" -o jsonpath='{.items[0].metadata.name}' 2>/dev/null || true)
  [ -n "$pod_a" ] && break
  sleep 1
done
[ -n "$pod_a" ] || { bad "no plugin pod was scheduled to $NODE_A"; exit 1; }
echo "plugin pod on $NODE_A: $pod_a"
token_kubeconfig "$WORK/plugin-a.kubeconfig" "$(kubectl -n "$NS" create token gputopo-kubelet-plugin --bound-object-kind Pod --bound-object-name "$pod_a" --duration 1h)"
token_kubeconfig "$WORK/plugin-unbound.kubeconfig" "$(kubectl -n "$NS" create token gputopo-kubelet-plugin --duration 1h)"
slice() { # NAME NODE DRIVER
  cat <<EOF
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata:
  name: $1
spec:
  driver: $3
  nodeName: $2
  pool: {name: verify-chart, generation: 1, resourceSliceCount: 1}
  devices: [{name: gpu-0}]
EOF
}
expect_allowed() { # WHAT KUBECONFIG ARGS...
  local what=$1 kc=$2
  shift 2
  if out=$(KUBECONFIG="$kc" kubectl "$@" 2>&1); then ok "$what"; else bad "$what: $out"; fi
}
expect_denied() { # WHAT PATTERN KUBECONFIG ARGS...
  local what=$1 pattern=$2 kc=$3
  shift 3
  if out=$(KUBECONFIG="$kc" kubectl "$@" 2>&1); then
    bad "$what: was allowed"
  elif grep -q -- "$pattern" <<<"$out"; then
    ok "$what: $(grep -o -- "$pattern.*" <<<"$out" | head -n1 | cut -c1-120)"
  else
    bad "$what: denied for another reason: $out"
  fi
}
PA="$WORK/plugin-a.kubeconfig"
slice verify-a "$NODE_A" gpu.gputopo.dev >"$WORK/slice-a.yaml"
slice verify-b "$NODE_B" gpu.gputopo.dev >"$WORK/slice-b.yaml"
slice verify-other "$NODE_A" other.example.com >"$WORK/slice-other.yaml"
expect_allowed "plugin on $NODE_A creates a slice of $NODE_A" "$PA" create -f "$WORK/slice-a.yaml"
expect_allowed "plugin on $NODE_A deletes it" "$PA" delete resourceslice verify-a
expect_denied "plugin on $NODE_A creates a slice of $NODE_B" "may only write ResourceSlices of that node" "$PA" create -f "$WORK/slice-b.yaml"
expect_denied "plugin on $NODE_A creates a slice of another driver" "may only write ResourceSlices of driver" "$PA" create -f "$WORK/slice-other.yaml"
kubectl create -f "$WORK/slice-b.yaml" >/dev/null
expect_denied "plugin on $NODE_A deletes a slice of $NODE_B" "may only write ResourceSlices of that node" "$PA" delete resourceslice verify-b
kubectl delete resourceslice verify-b >/dev/null
slice verify-a2 "$NODE_A" gpu.gputopo.dev >"$WORK/slice-a2.yaml"
expect_denied "token not bound to a pod on a node" "no authentication.kubernetes.io/node-name" "$WORK/plugin-unbound.kubeconfig" create -f "$WORK/slice-a2.yaml"
can() { # KUBECONFIG WANT VERB RESOURCE [ARGS...]
  local kc=$1 want=$2
  shift 2
  got=$(KUBECONFIG="$kc" kubectl auth can-i "$@" 2>/dev/null || true)
  if [ "$got" = "$want" ]; then ok "can-i $* = $want"; else bad "can-i $*: got '$got', want $want"; fi
}
can "$PA" yes get resourceclaims -n default
can "$PA" no list resourceclaims -n default
can "$PA" yes watch nodes
can "$PA" no update nodes
can "$PA" no list pods -A
can "$PA" no list secrets -A
can "$PA" yes watch configmaps/gputopo-label-mapping -n "$NS"
can "$PA" no get configmaps/other -n "$NS"

step "the installed DaemonSet and Deployment run the binaries as built here"
# The chart's pod specs must stay in step with the binaries: every arg must
# parse, and every directory the plugin is pointed at must be mounted.
mapfile -t ds_args < <(kubectl -n "$NS" get daemonsets -o jsonpath='{range .items[0].spec.template.spec.containers[0].args[*]}{@}{"\n"}{end}')
mapfile -t ds_mounts < <(kubectl -n "$NS" get daemonsets -o jsonpath='{range .items[0].spec.template.spec.containers[0].volumeMounts[*]}{.mountPath}{"\n"}{end}')
if NODE_NAME="$NODE_A" "$WORK/bin/gputopo-kubelet-plugin" "${ds_args[@]}" --print-resource-slices >/dev/null 2>"$WORK/ds-args.err"; then
  ok "the plugin accepts the DaemonSet's args: ${ds_args[*]}"
else
  bad "the plugin rejects the DaemonSet's args: $(cat "$WORK/ds-args.err")"
fi
for arg in "${ds_args[@]}"; do
  case "$arg" in
  --kubelet-registrar-directory-path=* | --cdi-root=*) dir=${arg#*=} ;;
  --kubelet-plugins-directory-path=*) dir=${arg#*=}/gpu.gputopo.dev ;;
  *) continue ;;
  esac
  if printf '%s\n' "${ds_mounts[@]}" | grep -qxF "$dir"; then ok "$dir is mounted from the host"; else bad "$dir is used by the plugin but not mounted (mounts: ${ds_mounts[*]})"; fi
done
mapfile -t ctl_args < <(kubectl -n "$NS" get deployments -o jsonpath='{range .items[0].spec.template.spec.containers[0].args[*]}{@}{"\n"}{end}')
if "$WORK/bin/gputopo-controller" "${ctl_args[@]}" --help >/dev/null 2>"$WORK/ctl-args.err"; then
  ok "the controller accepts the Deployment's args: ${ctl_args[*]}"
else
  bad "the controller rejects the Deployment's args: $(cat "$WORK/ctl-args.err")"
fi

step "kubelet plugin binary, with the token of the plugin pod on $NODE_A"
mkdir -p "$WORK/node-a/registry" "$WORK/node-a/plugins" "$WORK/node-a/cdi"
"$WORK/bin/gputopo-kubelet-plugin" --kubeconfig "$PA" --backend=sim --profile=dgx-h100 --node-name="$NODE_A" \
  --kubelet-registrar-directory-path="$WORK/node-a/registry" --kubelet-plugins-directory-path="$WORK/node-a/plugins" \
  --cdi-root="$WORK/node-a/cdi" --metrics-address="$PLUGIN_METRICS" --label-mapping="$NS/gputopo-label-mapping" >"$WORK/plugin.log" 2>&1 &
pids+=($!)
published=""
for _ in $(seq 30); do
  published=$(kubectl get resourceslices --field-selector spec.nodeName="$NODE_A",spec.driver=gpu.gputopo.dev \
    -o jsonpath='{range .items[*]}{.metadata.managedFields[*].manager}{"\n"}{end}' | grep -c gputopo-kubelet-plugin || true)
  [ "$published" -gt 0 ] && break
  sleep 1
done
if [ "$published" -gt 0 ]; then ok "the plugin wrote $published slice(s) of $NODE_A"; else bad "the plugin published nothing; log: $(tail -n 5 "$WORK/plugin.log")"; fi
if grep -Eiq 'forbidden|denied' "$WORK/plugin.log"; then bad "plugin log: $(grep -Ei 'forbidden|denied' "$WORK/plugin.log" | head -n 3)"; else ok "no forbidden/denied in the plugin log"; fi
curl -sf "http://$PLUGIN_METRICS/metrics" | grep -E '^gputopo_plugin_(published|unhealthy)_devices' | sed 's/^/  /' || bad "plugin metrics"

step "controller: RBAC"
CT="$WORK/controller.kubeconfig"
token_kubeconfig "$CT" "$(kubectl -n "$NS" create token gputopo-controller --duration 1h)"
can "$CT" yes patch pods -n default
can "$CT" yes update pods -n default
can "$CT" yes delete pods -n default
can "$CT" no create pods -n default
can "$CT" yes list jobs.batch -A
can "$CT" yes list resourceclaimtemplates.resource.k8s.io -A
can "$CT" no create resourceslices.resource.k8s.io
can "$CT" yes update resourceclaims.resource.k8s.io -n default
can "$CT" yes update resourceclaims.resource.k8s.io --subresource=status -n default
can "$CT" yes update resourceclaims.resource.k8s.io --subresource=binding -n default
can "$CT" no create resourceclaims.resource.k8s.io -n default
can "$CT" yes create events -n default
can "$CT" yes create leases.coordination.k8s.io -n "$NS"
can "$CT" yes update leases.coordination.k8s.io/gputopo-controller -n "$NS"
can "$CT" no update leases.coordination.k8s.io/kube-scheduler -n kube-system
can "$CT" no list secrets -A
can "$CT" yes get configmaps/gputopo-label-mapping -n "$NS"
# placements.gputopo.dev is not a served resource, so kubectl auth can-i
# cannot resolve it; ask the API server directly.
got=$(KUBECONFIG="$CT" kubectl create --validate=false -o jsonpath='{.status.allowed}' -f - <<'EOF' 2>&1 || true
apiVersion: authorization.k8s.io/v1
kind: SelfSubjectAccessReview
spec: {resourceAttributes: {group: gputopo.dev, resource: placements, verb: update}}
EOF
)
if [ "$got" = true ]; then ok "update placements.gputopo.dev allowed"; else bad "update placements.gputopo.dev: allowed=$got, want true"; fi

step "admission policies from the chart"
kubectl apply -f demo/specs/claims/gpu-1.yaml >/dev/null
pod() { # NAME PLACEMENT
  cat <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $1
  annotations:
    gputopo.dev/placement: $2
    gputopo.dev/group: verify
    gputopo.dev/group-size: "2"
spec:
  restartPolicy: Never
  containers:
  - name: c
    image: registry.k8s.io/pause:3.10
    resources:
      claims: [{name: gpu}]
  resourceClaims:
  - name: gpu
    resourceClaimTemplateName: gpu-1
EOF
}
# The policies act once the API server's policy informers have them: probe
# with server-side dry runs until both answer, rather than wait a while.
gated=""
for _ in $(seq 120); do
  out=$(pod bad-placement sideways | kubectl create --dry-run=server -f - 2>&1) || true
  gated=$(pod probe-gate same-leaf | kubectl create --dry-run=server -o jsonpath='{.spec.schedulingGates[*].name}' -f - 2>/dev/null || true)
  grep -q 'gputopo.dev/placement' <<<"$out" && [ "$gated" = gputopo.dev/topology ] && break
  sleep 0.5
done
if out=$(pod bad-placement sideways | kubectl create -f - 2>&1); then
  bad "a pod with gputopo.dev/placement: sideways was admitted"
else
  ok "placement policy: $(grep -o 'gputopo.dev/placement: .*' <<<"$out" | head -n1 | cut -c1-100)"
fi
pod verify-0 same-leaf | kubectl create -f - >/dev/null
pod verify-1 same-leaf | kubectl create -f - >/dev/null
gates=$(kubectl get pod verify-0 verify-1 -o jsonpath='{range .items[*]}{.spec.schedulingGates[*].name}{" "}{end}')
if [ "$gates" = "gputopo.dev/topology gputopo.dev/topology " ]; then ok "scheduling-gate policy gated both pods"; else bad "scheduling gates: '$gates'"; fi

step "controller binary, with its ServiceAccount token: Lease and a placement"
"$WORK/bin/gputopo-controller" --kubeconfig "$CT" --leader-election-namespace "$NS" \
  --leader-election-identity verify-chart --metrics-address "$CONTROLLER_METRICS" --retry-interval 2s \
  --label-mapping="$NS/gputopo-label-mapping" >"$WORK/controller.log" 2>&1 &
pids+=($!)
holder=""
for _ in $(seq 30); do
  holder=$(kubectl -n "$NS" get lease gputopo-controller -o jsonpath='{.spec.holderIdentity}' 2>/dev/null || true)
  [ "$holder" = verify-chart ] && break
  sleep 1
done
if [ "$holder" = verify-chart ]; then ok "the controller holds Lease $NS/gputopo-controller"; else bad "Lease holder: '$holder'"; fi
# The chart's readinessProbe: ok once the leader synced every group once.
ready=""
for _ in $(seq 120); do
  ready=$(curl -s "http://$CONTROLLER_METRICS/readyz" || true)
  [ "$ready" = ok ] && break
  sleep 0.5
done
if [ "$ready" = ok ]; then ok "the controller's /readyz (the chart's readinessProbe) says ok"; else bad "controller /readyz: '$ready'"; fi
placed=""
for _ in $(seq 60); do
  placed=$(kubectl get pod verify-0 verify-1 -o jsonpath='{range .items[*]}{.spec.nodeName}{" "}{end}')
  [[ "$placed" =~ ^[^\ ]+\ [^\ ]+\ $ ]] && break
  sleep 1
done
read -r n0 n1 <<<"$placed"
if [ -n "${n0:-}" ] && [ "${n0:-}" = "${n1:-}" ]; then
  ok "the group was placed and scheduled together on $n0 ($(kubectl get pod verify-0 -o jsonpath='{.metadata.annotations.gputopo\.dev/domain}'))"
else
  bad "pods not placed: nodeNames '$placed'; gates: $(kubectl get pod verify-0 -o jsonpath='{.spec.schedulingGates}'); status: $(kubectl get pod verify-0 -o jsonpath='{.metadata.annotations.gputopo\.dev/status}')"
fi
events=$(kubectl get events --field-selector involvedObject.name=verify-0,source=gputopo-controller -o name 2>/dev/null | wc -l)
if [ "$events" -gt 0 ]; then ok "the controller recorded $events event(s) on verify-0"; else echo "note: no controller events on verify-0"; fi
if grep -Eiq 'forbidden' "$WORK/controller.log"; then bad "controller log: $(grep -i forbidden "$WORK/controller.log" | head -n 3)"; else ok "no forbidden in the controller log"; fi

step "controller-written annotations: only the controller's ServiceAccount writes them"
# A pod neither the controller nor the scheduler acts on, and a user who
# may edit pods in default but holds no gputopo permission.
held() { # NAME [ANNOTATION: VALUE]
  cat <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $1
  annotations: {${2:-}}
spec:
  schedulingGates: [{name: verify.gputopo.dev/hold}]
  containers: [{name: c, image: registry.k8s.io/pause:3.10}]
EOF
}
expect_denied "create a pod with gputopo.dev/node" "gputopo.dev/node is written by the gputopo controller" \
  "$KUBECONFIG" create -f - <<<"$(held verify-node 'gputopo.dev/node: n1')"
held verify-held | kubectl create -f - >/dev/null
kubectl -n default create rolebinding verify-user-edit --clusterrole=edit --user=verify-user >/dev/null
for _ in $(seq 30); do
  [ "$(kubectl auth can-i patch pods -n default --as verify-user 2>/dev/null)" = yes ] && break
  sleep 1
done
expect_allowed "verify-user sets another annotation" "$KUBECONFIG" annotate pod verify-held --as verify-user example.com/note=x
expect_denied "verify-user sets gputopo.dev/status" "gputopo.dev/status is written by the gputopo controller" \
  "$KUBECONFIG" annotate pod verify-held --as verify-user 'gputopo.dev/status=Unschedulable: by hand'
expect_allowed "the controller's ServiceAccount sets gputopo.dev/status" "$CT" annotate pod verify-held -n default 'gputopo.dev/status=Unschedulable: verify'
expect_denied "verify-user removes gputopo.dev/status" "gputopo.dev/status is written by the gputopo controller" \
  "$KUBECONFIG" annotate pod verify-held --as verify-user gputopo.dev/status-
kubectl delete pod verify-held --force --grace-period=0 >/dev/null 2>&1 || true
kubectl -n default delete rolebinding verify-user-edit >/dev/null
curl -sf "http://$CONTROLLER_METRICS/metrics" | grep -E '^gputopo_controller_(decisions_total|pending_groups|leaf_gpu_utilization)' | sed 's/^/  /' || bad "controller metrics"

step "helm uninstall"
# Stop the binaries first: without their RBAC they would only log errors.
for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
pids=()
kubectl delete pod verify-0 verify-1 --force --grace-period=0 >/dev/null 2>&1 || true
if "$HELM" uninstall gputopo --namespace "$NS" --wait >/dev/null; then ok "helm uninstall"; else bad "helm uninstall"; fi
left=$(kubectl get validatingadmissionpolicies,mutatingadmissionpolicies,deviceclasses,clusterroles,clusterrolebindings -o name | grep -c gputopo || true)
if [ "$left" -eq 0 ]; then ok "no cluster-scoped gputopo objects left"; else bad "$left cluster-scoped gputopo objects left"; fi

if [ "$fail" -ne 0 ]; then
  echo
  echo "logs: KEEP=1 $0 keeps $WORK"
  printf 'verify-chart-cluster: FAILED\n'
  exit 1
fi
printf '\nverify-chart-cluster: OK\n'
