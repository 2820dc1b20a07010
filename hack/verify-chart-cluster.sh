#!/usr/bin/env bash
# Installs the Helm chart into the repository's local Kubernetes cluster
# (the newest supported release, or GPUTOPO_K8S_VERSION's; test/cluster:
# real apiserver, scheduler and controller-manager; no Docker) and runs the
# chart's DaemonSet and Deployment from the project's own image:
#   - the image is built without Docker or a registry
#     (hack/build-image-oci.sh: an OCI layout tarball named as the chart's
#     default image, ghcr.io/gputopo/gputopo:<appVersion>) and imported into
#     a node that runs containerd 2.4 and runc (test/cluster/README.md);
#   - on that node the DaemonSet's plugin pod runs from the image, registers
#     with the node's kubelet (its startup probe passes) and publishes the
#     node's ResourceSlices with its own pod-bound ServiceAccount token,
#     through the chart's ResourceSlice policy; the Deployment's controller
#     pod runs from the image, takes the leader Lease, is ready, and places
#     a gated Job whose pods the plugin pod prepares: their containers run
#     there and print the environment of their claims' CDI specs;
#   - then, upgraded to the chart's default backend, nvml, over a fake
#     driver root whose libnvidia-ml.so.1 is an NVML stand-in
#     (hack/fakedriver), the plugin pod from the image publishes the GPUs
#     NVML reports and prepares a pod whose container gets the driver's
#     device nodes and libraries, linked and cached by the image's
#     nvidia-cdi-hook;
# and checks what a template cannot:
#   - the API server accepts every object (schemas, CEL of the admission
#     policies) and `helm install` / `helm uninstall` succeed,
#   - the plugin's RBAC and ResourceSlice policy, with ServiceAccount tokens
#     minted here: a token bound to a plugin pod on node A may write
#     gpu.gputopo.dev slices of node A only,
#   - the controller's RBAC denies what it must not do,
#   - both read the chart's label mapping ConfigMap, and no other,
#   - the placement policy lets the controller's ServiceAccount, and not a
#     user who may edit pods, write the controller's annotations.
# The cluster's other two nodes are fake (no kubelet; the harness publishes
# their slices): the plugin pods bound there never run, and their tokens
# serve the RBAC checks; the controller pod places a gated group of pods
# there too.
#
# On this local cluster pods connect to nothing (no kube-proxy, and pod
# network namespaces reach neither the host nor the API server on
# 127.0.0.1), so both pods run with hostNetwork and KUBERNETES_SERVICE_HOST
# and _PORT naming the API server (kubeletPlugin/controller.hostNetwork and
# .extraEnv); the kubelet plugin and CDI directories are the node's, under
# the cluster directory (kubeletPlugin.kubeletDir and .cdiRoot).
#
# Needs the Kubernetes binaries and containerd (make k8s-binaries; cached in
# ~/.cache/gputopo/), root, runc and busybox-static (make runtime-deps),
# apt-get for the image's libc6 (hack/build-image-oci.sh) and helm
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
# The chart's image, as hack/build-image-oci.sh names it by default.
IMAGE="ghcr.io/gputopo/gputopo:$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$CHART/Chart.yaml")"

WORK=$(mktemp -d /tmp/gputopo-chart.XXXXXX) # short: unix sockets live below
CLUSTER="$WORK/c"
cleanup() {
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

# A free TCP port on 127.0.0.1 (nothing answers there), from a random start.
free_port() {
  local p
  for _ in $(seq 200); do
    p=$((20000 + RANDOM % 20000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      echo "$p"
      return
    fi
  done
  echo "verify-chart-cluster: no free port found" >&2
  exit 1
}
# The pods run in the host's network namespace: their ports must be free.
PLUGIN_METRICS_PORT=$(free_port)
PLUGIN_HEALTH_PORT=$(free_port)
CONTROLLER_METRICS_PORT=$(free_port)

step "build localcluster, the binaries (as make build does) and the image $IMAGE"
mkdir -p "$WORK/bin"
go build -C test/cluster -o "$WORK/bin/localcluster" ./cmd/localcluster
go build -tags=grpcnotrace -ldflags="-s -w" -o "$WORK/bin/" ./cmd/gputopo-kubelet-plugin ./cmd/gputopo-controller ./cmd/gputopo
hack/build-cdi-hook.sh "$WORK/bin"
image_tag=${IMAGE##*:}
BIN="$WORK/bin" IMAGE="${IMAGE%:*}" TAG="$image_tag" OUT="$WORK/gputopo-image.oci.tar" hack/build-image-oci.sh >"$WORK/image.log" 2>&1 || {
  cat "$WORK/image.log"
  exit 1
}
grep '^ociimage:' "$WORK/image.log"

NODE_A=gpu-a NODE_B=gpu-b RNODE=gpu-ctr
step "start a local $("$K8S_BIN/kube-apiserver" --version) cluster: fake nodes $NODE_A and $NODE_B, $RNODE on containerd with the image"
cat >"$WORK/topology.yaml" <<EOF
nodes:
- {name: $NODE_A, leaf: leaf-0, spine: spine-0, profile: dgx-h100}
- {name: $NODE_B, leaf: leaf-1, spine: spine-0, profile: dgx-h100}
- {name: $RNODE, leaf: leaf-2, spine: spine-0, profile: dgx-h100, real: true, runtime: containerd}
EOF
# --no-plugin: the harness runs no plugin of its own on $RNODE; the
# chart's DaemonSet does.
"$WORK/bin/localcluster" up --topology "$WORK/topology.yaml" --dir "$CLUSTER" --bin-dir "$K8S_BIN" \
  --plugin-bin "$WORK/bin/gputopo-kubelet-plugin" --no-plugin "$RNODE" --image "$WORK/gputopo-image.oci.tar" >"$WORK/up.log" 2>&1 || {
  cat "$WORK/up.log"
  exit 1
}
export KUBECONFIG="$CLUSTER/kubeconfig"
echo "nodes: $(kubectl get nodes -o jsonpath='{.items[*].metadata.name}')"
server=$(kubectl config view --raw --minify -o jsonpath='{.clusters[0].cluster.server}')
RDIR="$CLUSTER/nodes/$RNODE"

step "helm install (backend=sim, the chart's image; the pods run on $RNODE)"
kubectl create namespace "$NS" >/dev/null
kubectl label namespace "$NS" pod-security.kubernetes.io/enforce=privileged >/dev/null
server_host=${server#https://}
server_port=${server_host##*:}
server_host=${server_host%:*}
cat >"$WORK/values.yaml" <<EOF
backend: sim
sim: {profile: dgx-h100}
metrics: {service: true}
kubeletPlugin:
  # The node's kubelet root and the CDI directory its containerd reads.
  kubeletDir: $RDIR/kubelet
  cdiRoot: $RDIR/cdi
  hostNetwork: true
  metricsPort: $PLUGIN_METRICS_PORT
  healthProbePort: $PLUGIN_HEALTH_PORT
  extraEnv:
  - {name: KUBERNETES_SERVICE_HOST, value: "$server_host"}
  - {name: KUBERNETES_SERVICE_PORT, value: "$server_port"}
  tolerations:
  - {key: localcluster.gputopo.dev/runtime, operator: Exists, effect: NoSchedule}
controller:
  replicas: 1
  hostNetwork: true
  metricsPort: $CONTROLLER_METRICS_PORT
  nodeSelector: {kubernetes.io/hostname: $RNODE}
  tolerations:
  - {key: localcluster.gputopo.dev/runtime, operator: Exists, effect: NoSchedule}
  extraEnv:
  - {name: KUBERNETES_SERVICE_HOST, value: "$server_host"}
  - {name: KUBERNETES_SERVICE_PORT, value: "$server_port"}
EOF
if "$HELM" install gputopo "$CHART" --namespace "$NS" -f "$WORK/values.yaml" >"$WORK/install.log" 2>&1; then
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
kubectl config view --raw --minify --flatten -o jsonpath='{.clusters[0].cluster.certificate-authority-data}' | base64 -d >"$WORK/ca.crt"
token_kubeconfig() { # FILE TOKEN
  KUBECONFIG="$1" kubectl config set-cluster c --server="$server" --certificate-authority="$WORK/ca.crt" --embed-certs >/dev/null
  KUBECONFIG="$1" kubectl config set-credentials u --token="$2" >/dev/null
  KUBECONFIG="$1" kubectl config set-context c --cluster=c --user=u >/dev/null
  KUBECONFIG="$1" kubectl config use-context c >/dev/null
}

step "the DaemonSet's plugin pod on $RNODE, from the image"
read -r _ _ manifest_digest _ config_digest < <(grep '^ociimage:' "$WORK/image.log" | sed 's/^ociimage: wrote [^ ]* //')
imported=$(kubectl get node "$RNODE" -o jsonpath='{.status.images[*].names}' | tr -d '[]"' | tr ',' ' ')
if grep -qw -- "$IMAGE" <<<"$imported"; then ok "$RNODE's containerd has $IMAGE"; else bad "$RNODE's containerd lacks $IMAGE (it has: $imported)"; fi
# pod_on COMPONENT NODE: the name of the component's pod bound to NODE.
pod_on() {
  local name=""
  for _ in $(seq 120); do
    name=$(kubectl -n "$NS" get pods -l app.kubernetes.io/component="$1" --field-selector spec.nodeName="$2" \
      -o jsonpath='{.items[0].metadata.name}' 2>/dev/null || true)
    [ -n "$name" ] && break
    sleep 1
  done
  echo "$name"
}
# runs_from_image WHAT POD: Ready (its probes pass), from the image built here.
runs_from_image() {
  local what=$1 pod=$2 image image_id
  # A cold start on a loaded machine: the plugin waits for its Node, then
  # the startup probe asks every 5 s.
  if kubectl -n "$NS" wait --for=condition=Ready --timeout=300s "pod/$pod" >/dev/null 2>&1; then
    ok "$what $pod is Ready on $(kubectl -n "$NS" get pod "$pod" -o jsonpath='{.spec.nodeName}')"
  else
    bad "$what $pod is not Ready: $(kubectl -n "$NS" get pod "$pod" -o jsonpath='{.status.containerStatuses[0].state}{" "}{.status.conditions}')"
    kubectl -n "$NS" logs "$pod" --tail=20 2>&1 | sed 's/^/  log: /'
    return
  fi
  image=$(kubectl -n "$NS" get pod "$pod" -o jsonpath='{.status.containerStatuses[0].image}')
  image_id=$(kubectl -n "$NS" get pod "$pod" -o jsonpath='{.status.containerStatuses[0].imageID}')
  # containerd reports the image ID (the config digest) of an imported
  # image, or a repository digest (the manifest digest) once it has one.
  if [ "$image" = "$IMAGE" ] && { [ "$image_id" = "$config_digest" ] || [ "${image_id##*@}" = "$manifest_digest" ]; }; then
    ok "$what runs $image, image ID $image_id: the image built here"
  else
    bad "$what runs $image ($image_id), want $IMAGE (config $config_digest, manifest $manifest_digest)"
  fi
}
# claim_specs_left: the claims' CDI spec files left in $RNODE's cdi/ once
# they are gone or after two minutes (the kubelet asks the plugin to
# unprepare a claim once its pod has terminated).
claim_specs_left() {
  local specs=""
  for _ in $(seq 120); do
    specs=$(find "$RDIR/cdi" -name '*_*.json' -printf '%f ' 2>/dev/null)
    [ -z "$specs" ] && break
    sleep 1
  done
  echo "$specs"
}
rpod=$(pod_on kubelet-plugin "$RNODE")
[ -n "$rpod" ] || { bad "no plugin pod was scheduled to $RNODE"; exit 1; }
runs_from_image "plugin pod" "$rpod"
if grep -q "Registered DRA plugin.*driverName=\"gpu.gputopo.dev\"" "$CLUSTER/logs/kubelet-$RNODE.log"; then
  ok "the kubelet of $RNODE registered gpu.gputopo.dev: $(grep -o 'endpoint="[^"]*"' "$CLUSTER/logs/kubelet-$RNODE.log" | tail -n1)"
else
  bad "the kubelet of $RNODE did not register gpu.gputopo.dev"
fi
published=""
for _ in $(seq 60); do
  published=$(kubectl get resourceslices --field-selector spec.nodeName="$RNODE",spec.driver=gpu.gputopo.dev \
    -o jsonpath='{range .items[*]}{.metadata.managedFields[*].manager}{"\n"}{end}' | grep -c gputopo-kubelet-plugin || true)
  [ "$published" -gt 0 ] && break
  sleep 1
done
if [ "$published" -gt 0 ]; then
  ok "the plugin pod published $published slice(s) of $RNODE ($(kubectl get resourceslices --field-selector spec.nodeName="$RNODE" -o jsonpath='{range .items[*]}{.spec.devices[*].name}{end}' | wc -w) devices)"
else
  bad "no slice of $RNODE from the plugin pod"
fi
kubectl -n "$NS" logs "$rpod" >"$WORK/plugin.log" 2>&1 || true
if grep -Eiq 'forbidden|denied' "$WORK/plugin.log"; then bad "plugin log: $(grep -Ei 'forbidden|denied' "$WORK/plugin.log" | head -n 3)"; else ok "no forbidden/denied in the plugin pod's log"; fi
curl -sf "http://127.0.0.1:$PLUGIN_METRICS_PORT/metrics" | grep -E '^gputopo_plugin_(published|unhealthy)_devices' | sed 's/^/  /' || bad "plugin metrics on :$PLUGIN_METRICS_PORT"

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
# The controller runs already and may open the gates at once: read them
# from the create responses, which admission wrote.
gates=$(pod verify-0 same-leaf | kubectl create -o jsonpath='{.spec.schedulingGates[*].name}{" "}' -f -)
gates+=$(pod verify-1 same-leaf | kubectl create -o jsonpath='{.spec.schedulingGates[*].name}{" "}' -f -)
if [ "$gates" = "gputopo.dev/topology gputopo.dev/topology " ]; then ok "scheduling-gate policy gated both pods"; else bad "scheduling gates: '$gates'"; fi

step "the Deployment's controller pod on $RNODE, from the image: Lease, readiness, placements"
cpod=$(pod_on controller "$RNODE")
[ -n "$cpod" ] || { bad "no controller pod was scheduled to $RNODE"; exit 1; }
runs_from_image "controller pod" "$cpod"
holder=""
for _ in $(seq 60); do
  holder=$(kubectl -n "$NS" get lease gputopo-controller -o jsonpath='{.spec.holderIdentity}' 2>/dev/null || true)
  [ "$holder" = "$cpod" ] && break
  sleep 1
done
if [ "$holder" = "$cpod" ]; then ok "the controller pod holds Lease $NS/gputopo-controller"; else bad "Lease holder: '$holder', want $cpod"; fi
ready=$(curl -s "http://127.0.0.1:$CONTROLLER_METRICS_PORT/readyz" || true)
if [ "$ready" = ok ]; then ok "the controller's /readyz (the chart's readinessProbe) says ok"; else bad "controller /readyz: '$ready'"; fi
placed=""
for _ in $(seq 120); do
  placed=$(kubectl get pod verify-0 verify-1 -o jsonpath='{range .items[*]}{.spec.nodeName}{" "}{end}')
  [[ "$placed" =~ ^[^\ ]+\ [^\ ]+\ $ ]] && break
  sleep 1
done
read -r n0 n1 <<<"$placed"
if [ -n "${n0:-}" ] && [ "${n0:-}" = "${n1:-}" ]; then
  ok "the gated pod group on the fake nodes was placed and scheduled together on $n0 ($(kubectl get pod verify-0 -o jsonpath='{.metadata.annotations.gputopo\.dev/domain}'))"
else
  bad "pods not placed: nodeNames '$placed'; gates: $(kubectl get pod verify-0 -o jsonpath='{.spec.schedulingGates}'); status: $(kubectl get pod verify-0 -o jsonpath='{.metadata.annotations.gputopo\.dev/status}')"
fi
# A Job whose two pods run on $RNODE: gated by the chart's policy, placed by
# the controller pod, their claims prepared by the plugin pod (the CDI
# specs it writes into the node's cdi/, which containerd reads), their
# containers run from the local busybox image and print what the specs
# gave them.
cat >"$WORK/job.yaml" <<EOF
apiVersion: batch/v1
kind: Job
metadata:
  name: verify-image
spec:
  completions: 2
  parallelism: 2
  completionMode: Indexed
  backoffLimit: 0
  template:
    metadata:
      annotations:
        gputopo.dev/placement: same-leaf
    spec:
      restartPolicy: Never
      nodeSelector: {kubernetes.io/hostname: $RNODE}
      tolerations: [{key: localcluster.gputopo.dev/runtime, operator: Exists, effect: NoSchedule}]
      containers:
      - name: show
        image: localhost/gputopo/busybox:v1
        imagePullPolicy: Never
        command: ["sh", "-c", "env | grep -E '^(NVIDIA|GPUTOPO)_' | sort"]
        resources:
          claims: [{name: gpu}]
      resourceClaims:
      - name: gpu
        resourceClaimTemplateName: gpu-1
EOF
kubectl create -f "$WORK/job.yaml" >/dev/null
if kubectl wait --for=condition=Complete --timeout=300s job/verify-image >/dev/null 2>&1; then
  ok "Job verify-image completed on $RNODE"
else
  bad "Job verify-image did not complete: $(kubectl get pods -l batch.kubernetes.io/job-name=verify-image -o jsonpath='{range .items[*]}{.metadata.name}{" "}{.spec.nodeName}{" "}{.status.phase}{" "}{.spec.schedulingGates}{" "}{.metadata.annotations.gputopo\.dev/status}{"; "}{end}')"
fi
for p in $(kubectl get pods -l batch.kubernetes.io/job-name=verify-image -o name); do
  node=$(kubectl get "$p" -o jsonpath='{.spec.nodeName}')
  domain=$(kubectl get "$p" -o jsonpath='{.metadata.annotations.gputopo\.dev/domain}')
  out=$(kubectl logs "$p" 2>&1 || true)
  if [ "$node" = "$RNODE" ] && [ -n "$domain" ] && grep -qx "GPUTOPO_NODE=$RNODE" <<<"$out" && grep -q '^NVIDIA_VISIBLE_DEVICES=GPU-' <<<"$out"; then
    ok "${p#pod/}: placed in $domain, ran on $node; its container got $(grep -c . <<<"$out") variables from the CDI spec, e.g. $(grep '^NVIDIA_VISIBLE_DEVICES=' <<<"$out")"
  else
    bad "${p#pod/}: node '$node', domain '$domain', container output: $out"
  fi
done
# Once the pods have terminated, the kubelet asks the plugin pod to
# unprepare their claims: it removes their CDI specs from the node's cdi/.
specs=$(claim_specs_left)
if [ -z "$specs" ]; then ok "the plugin pod removed the claims' CDI specs from $RNODE's cdi/ (left: $(find "$RDIR/cdi" -type f -printf '%f ' 2>/dev/null))"; else bad "claim CDI specs left in $RDIR/cdi: $specs"; fi
events=$(kubectl get events --field-selector involvedObject.name=verify-image,source=gputopo-controller -o jsonpath='{.items[*].reason}' 2>/dev/null)
if [ -n "$events" ]; then ok "the controller recorded events on Job verify-image: $events"; else echo "note: no controller events on Job verify-image"; fi
kubectl -n "$NS" logs "$cpod" >"$WORK/controller.log" 2>&1 || true
# The controller reads its container's memory limit from its cgroup and
# gives the Go runtime 90 % of it.
limit=$(kubectl -n "$NS" get pod "$cpod" -o jsonpath='{.spec.containers[0].resources.limits.memory}')
want=$(( $(numfmt --from=iec-i "$limit") * 9 / 10 ))
got=$(grep 'Go runtime memory limit' "$WORK/controller.log" | grep -o 'bytes=[0-9]*' | head -n1)
if [ "$got" = "bytes=$want" ]; then ok "the controller set Go's memory limit to 90 % of its container's $limit: $want bytes"; else bad "Go memory limit of the controller: '$got', want bytes=$want (90 % of $limit)"; fi
if grep -Eiq 'forbidden' "$WORK/controller.log"; then bad "controller log: $(grep -i forbidden "$WORK/controller.log" | head -n 3)"; else ok "no forbidden in the controller pod's log"; fi

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
curl -sf "http://127.0.0.1:$CONTROLLER_METRICS_PORT/metrics" | grep -E '^gputopo_controller_(decisions_total|pending_groups|leaf_gpu_utilization)' | sed 's/^/  /' || bad "controller metrics"

step "the chart's default backend, nvml, from the image over a stand-in NVML on $RNODE"
# No GPU here: the driver root is hack/fakedriver's, laid out like a real
# install (versioned ELF libraries, nvidia-smi, firmware, device nodes) with
# a libnvidia-ml.so.1 that answers for eight H100s behind an NVSwitch. The
# plugin pod loads it with dlopen through the image's libc6, and generates
# the claims' driver edits with the image's nvcdi and its nvidia-cdi-hook,
# installed onto the node.
DRV="$RDIR/nvidia-driver"
mkdir -p "$DRV"
if go run ./hack/fakedriver --root "$DRV" --gpus 8 >"$WORK/fakedriver.log" 2>&1; then
  ok "hack/fakedriver laid out a driver root at $DRV"
else
  cat "$WORK/fakedriver.log"
  bad "hack/fakedriver"
  exit 1
fi
first_uuid=$(head -n1 "$WORK/fakedriver.log")
if "$HELM" upgrade gputopo "$CHART" --namespace "$NS" -f "$WORK/values.yaml" --set backend=nvml \
  --set nvml.driverRoot="$DRV" --set kubeletPlugin.gpuNodesOnly=false >"$WORK/upgrade.log" 2>&1; then
  ok "helm upgrade to backend=nvml"
else
  cat "$WORK/upgrade.log"
  bad "helm upgrade to backend=nvml"
  exit 1
fi
# The plugin pods of the fake nodes never become available, which can hold
# a rolling update back: replace $RNODE's pod by hand.
kubectl -n "$NS" delete pod "$rpod" --wait --timeout=120s >/dev/null 2>&1 || true
npod=""
for _ in $(seq 120); do
  npod=$(kubectl -n "$NS" get pods -l app.kubernetes.io/component=kubelet-plugin --field-selector spec.nodeName="$RNODE" \
    -o jsonpath='{range .items[*]}{.metadata.name}{" "}{.spec.containers[0].args}{"\n"}{end}' 2>/dev/null | grep -e '--backend=nvml' | cut -d' ' -f1 | head -n1 || true)
  [ -n "$npod" ] && break
  sleep 1
done
[ -n "$npod" ] || { bad "no plugin pod with --backend=nvml on $RNODE"; exit 1; }
runs_from_image "nvml plugin pod" "$npod"
uuids=""
for _ in $(seq 60); do
  uuids=$(kubectl get resourceslices --field-selector spec.nodeName="$RNODE",spec.driver=gpu.gputopo.dev \
    -o jsonpath='{range .items[*].spec.devices[*]}{.attributes.uuid.string}{" "}{end}')
  grep -q -- "$first_uuid" <<<"$uuids" && break
  sleep 1
done
if [ "$(wc -w <<<"$uuids")" -eq 8 ] && grep -q -- "$first_uuid" <<<"$uuids"; then
  ok "the nvml plugin pod published the 8 GPUs NVML reports ($first_uuid, ...; nvlinkDomain $(kubectl get resourceslices --field-selector spec.nodeName="$RNODE" -o jsonpath='{.items[0].spec.devices[0].attributes.nvlinkDomain.string}'))"
else
  bad "slices of $RNODE after the switch to nvml: UUIDs '$uuids', want the stand-in's 8"
  kubectl -n "$NS" logs "$npod" --tail=20 2>&1 | sed 's/^/  log: /'
fi
cat >"$WORK/nvml-pod.yaml" <<EOF
apiVersion: v1
kind: Pod
metadata: {name: verify-nvml}
spec:
  restartPolicy: Never
  nodeSelector: {kubernetes.io/hostname: $RNODE}
  tolerations: [{key: localcluster.gputopo.dev/runtime, operator: Exists, effect: NoSchedule}]
  containers:
  - name: show
    image: localhost/gputopo/busybox:v1
    imagePullPolicy: Never
    command: ["sh", "-c", "env | grep -E '^(NVIDIA|GPUTOPO)_' | sort; ls /dev/nvidia* /usr/lib/x86_64-linux-gnu; echo ldcache-libcuda=\$(grep -c libcuda.so.1 /etc/ld.so.cache)"]
    resources: {claims: [{name: gpu}]}
  resourceClaims: [{name: gpu, resourceClaimTemplateName: gpu-1}]
EOF
kubectl create -f "$WORK/nvml-pod.yaml" >/dev/null
if kubectl wait --for=jsonpath='{.status.phase}'=Succeeded --timeout=180s pod/verify-nvml >/dev/null 2>&1; then
  out=$(kubectl logs verify-nvml 2>&1 || true)
  if grep -qx 'NVIDIA_VISIBLE_DEVICES=void' <<<"$out" && grep -q '=GPU-fa4e' <<<"$out" && grep -q '^/dev/nvidia[0-9]' <<<"$out" &&
    grep -qx 'libcuda.so.1' <<<"$out" && grep -q '^ldcache-libcuda=[1-9]' <<<"$out"; then
    ok "verify-nvml ran with the nvml plugin's spec: $(grep -E '^/dev/nvidia[0-9]+$' <<<"$out" | tr '\n' ' ')$(grep '=GPU-fa4e' <<<"$out" | head -n1), libcuda.so.1 linked and in the ldconfig cache by the hooks"
  else
    bad "verify-nvml's container output: $out"
  fi
else
  bad "verify-nvml did not succeed: $(kubectl get pod verify-nvml -o jsonpath='{.status.phase}{" "}{.status.conditions}')"
  kubectl -n "$NS" logs "$npod" --tail=20 2>&1 | sed 's/^/  log: /'
fi
hook="$RDIR/kubelet/plugins/gpu.gputopo.dev/nvidia-cdi-hook"
if [ -x "$hook" ]; then ok "the plugin pod installed the image's nvidia-cdi-hook at $hook"; else bad "no nvidia-cdi-hook installed at $hook"; fi
kubectl delete pod verify-nvml --wait --timeout=120s >/dev/null 2>&1 || bad "delete pod verify-nvml"
specs=$(claim_specs_left)
if [ -z "$specs" ]; then ok "the nvml plugin pod removed verify-nvml's CDI spec"; else bad "claim CDI specs left in $RDIR/cdi: $specs"; fi

step "helm uninstall"
# The Job's pods first, while the plugin pod runs to unprepare their claims.
kubectl delete job verify-image --cascade=foreground --wait --timeout=120s >/dev/null 2>&1 || bad "delete Job verify-image"
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
