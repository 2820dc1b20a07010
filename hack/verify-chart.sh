#!/usr/bin/env bash
# Checks the Helm chart deployments/helm/gputopo without a cluster:
#   1. its admission policies are deployments/admission/*.yaml verbatim,
#   2. `helm lint --strict` with default, sim and per-node-sim values,
#   3. `helm template` for several value sets; every rendered object must
#      decode strictly into the Kubernetes 1.37 Go types (hack/chartcheck)
#      and each case renders the expected objects,
#   4. values the chart must refuse are refused.
# Rendered manifests are left in _output/chart/ for inspection.
#
# helm comes from $HELM, else hack/install-helm.sh builds it (once; several
# minutes cold). Needs only Go.
set -euo pipefail
cd "$(dirname "$0")/.."

CHART=deployments/helm/gputopo
OUT=_output/chart
KUBE_VERSION="${KUBE_VERSION:-1.37.2}"
HELM="${HELM:-$(hack/install-helm.sh)}"
mkdir -p "$OUT"
rm -f "$OUT"/*.yaml
fail=0
step() { printf '\n== %s\n' "$*"; }

step "admission policies match deployments/admission"
if diff -r deployments/admission "$CHART/files/admission"; then
  echo "identical"
else
  echo "FAIL: run: cp deployments/admission/*.yaml $CHART/files/admission/"
  fail=1
fi

step "go build hack/chartcheck"
CHECK="$OUT/chartcheck"
go build -o "$CHECK" ./hack/chartcheck

SIM=(--set backend=sim --set sim.profile=dgx-h100)
PER_NODE=(--set backend=sim --set-json 'sim.nodeProfiles=["dgx-h100","dgx1-v100","hgx-pcie-pairs"]')

step "helm lint --strict"
for name in default sim per-node; do
  case "$name" in
    default) args=() ;;
    sim) args=("${SIM[@]}") ;;
    per-node) args=("${PER_NODE[@]}") ;;
  esac
  if ! "$HELM" lint --strict --quiet --kube-version "$KUBE_VERSION" "$CHART" "${args[@]}"; then
    echo "FAIL: helm lint ($name)"
    fail=1
  else
    echo "ok: lint $name"
  fi
done

# render NAME EXPECT ARGS...: helm template into $OUT/NAME.yaml, then check it.
render() {
  local name=$1 expect=$2
  shift 2
  if ! "$HELM" template gputopo "$CHART" --namespace gputopo --kube-version "$KUBE_VERSION" "$@" >"$OUT/$name.yaml"; then
    echo "FAIL: helm template ($name)"
    fail=1
    return
  fi
  printf '%-12s ' "$name:"
  if ! "$CHECK" -expect "$expect" "$OUT/$name.yaml"; then
    echo "FAIL: rendered objects ($name)"
    fail=1
  fi
}
# must FILE [--] PATTERN MESSAGE / mustnot FILE [--] PATTERN MESSAGE: grep
# assertions; "--" before a pattern that starts with a dash.
must() {
  local f=$1; shift; [ "$1" = -- ] && shift
  grep -Eq -- "$1" "$OUT/$f.yaml" || { echo "FAIL: $f: $2"; fail=1; }
}
mustnot() {
  local f=$1; shift; [ "$1" = -- ] && shift
  ! grep -Eq -- "$1" "$OUT/$f.yaml" || { echo "FAIL: $f: $2"; fail=1; }
}

step "helm template (Kubernetes $KUBE_VERSION) + strict decoding"
BASE="ServiceAccount=2,ClusterRole=2,ClusterRoleBinding=2,Role=2,RoleBinding=2,ConfigMap=1,Deployment=1,PodDisruptionBudget=1,Service=2,DeviceClass=1"
POLICIES="ValidatingAdmissionPolicy=4,ValidatingAdmissionPolicyBinding=4,MutatingAdmissionPolicy=2,MutatingAdmissionPolicyBinding=2"
render default "$BASE,$POLICIES,DaemonSet=1,ServiceMonitor=0"
must default 'privileged: true' "nvml plugin must run privileged"
must default 'path: /dev$' "nvml plugin must mount /dev"
must default -- '--nvidia-driver-root=/$' "nvml plugin must get the host driver root"
must default -- '--container-driver-root=/driver-root$' "nvml plugin must know where the driver root is mounted"
mustnot default -- '--nvidia-cdi-hook-path' "by default the plugin installs the image's nvidia-cdi-hook"
must default 'key: nvidia.com/gpu.present, operator: In' "nvml plugin must run only on GPU nodes (GPU feature discovery label)"
must default 'key: feature.node.kubernetes.io/pci-10de.present, operator: In' "nvml plugin must run only on GPU nodes (node feature discovery label)"
must default 'mountPropagation: HostToContainer' "the driver root must follow mounts made after the plugin started"
must default 'service: startup' "nvml plugin must have a startup probe"
must default 'service: liveness' "nvml plugin must have a liveness probe"
must default -- '--health-probe-address=:51516$' "plugin must serve the probes"
must default -- '--ignored-xids=13,31,43,45,68,109$' "nvml plugin must get the ignored Xids"
must default -- '--taint-effect=NoSchedule$' "plugin must get the taint effect"
mustnot default -- '--nvml-library-path' "the library is found under the driver root by default"
mustnot default 'name: dev-root' "a dev root inside the driver root needs no mount"
must default 'leader-elect=true' "controller must use leader election"
mustnot default 'extendedResourceName' "extendedResourceName must be off by default"

render sim "$BASE,$POLICIES,DaemonSet=1" "${SIM[@]}"
must sim -- '--profile=dgx-h100' "sim plugin must get --profile"
mustnot sim 'privileged: true' "sim plugin must not run privileged"
mustnot sim 'path: /dev$' "sim plugin must not mount /dev"
mustnot sim 'pci-10de' "sim plugin must not require GPU nodes"

render per-node "$BASE,$POLICIES,DaemonSet=3" "${PER_NODE[@]}"
must per-node 'gputopo.dev/profile: dgx1-v100' "per-node DaemonSet must select nodes by gputopo.dev/profile"
must per-node -- '--profile=hgx-pcie-pairs' "per-node DaemonSet must pass its profile"

render everything "$BASE,$POLICIES,DaemonSet=1,ServiceMonitor=1" \
  --set metrics.serviceMonitor.enabled=true --set deviceClass.extendedResource.enabled=true \
  --set-json 'labelMapping.leaf=["example.com/leaf","example.com/rack"]' --set labelMapping.tierPrefix= \
  --set kubeletPlugin.numaNodeList=true --set nvml.driverRoot=/run/nvidia/driver \
  --set nvml.devRoot=/opt/devroot --set nvml.cdiHookPath=/usr/local/nvidia/toolkit/nvidia-cdi-hook \
  --set nvml.libraryPath=/usr/lib64/libnvidia-ml.so.1 --set nvml.mpsControlPath=/opt/cuda/bin/nvidia-cuda-mps-control --set-json 'nvml.ignoredXids=[13,79]' \
  --set kubeletPlugin.taintEffect=NoExecute --set-json 'kubeletPlugin.sharedGPUs="0,1"' \
  --set kubeletPlugin.hostNetwork=true --set controller.hostNetwork=true \
  --set-json 'kubeletPlugin.extraEnv=[{"name":"KUBERNETES_SERVICE_HOST","value":"10.0.0.5"}]' \
  --set-json 'controller.extraEnv=[{"name":"GODEBUG","value":"http2debug=1"}]'
must everything 'extendedResourceName: gputopo.dev/gpu' "extendedResourceName toggle"
must everything -- '--dev-root=/opt/devroot$' "devRoot must reach the plugin"
must everything 'path: /opt/devroot/dev$' "a dev root outside the driver root must be mounted"
must everything -- '--nvml-library-path=/driver-root/usr/lib64/libnvidia-ml.so.1$' "libraryPath must be below the mounted driver root"
must everything -- '--mps-control-path=/driver-root/opt/cuda/bin/nvidia-cuda-mps-control$' "mpsControlPath must be below the mounted driver root"
must everything -- '--ignored-xids=13,79$' "ignoredXids must reach the plugin"
must everything -- '--taint-effect=NoExecute$' "taintEffect must reach the plugin"
must everything -- '--shared-gpus=0,1$' "shared GPUs must reach the plugin"
must everything 'leaf: "example.com/leaf,example.com/rack"' "leaf labels must reach the label mapping ConfigMap"
must everything 'tierPrefix: ""' "an empty tier prefix must be kept"
[ "$(grep -c '^      hostNetwork: true$' "$OUT/everything.yaml")" = 2 ] ||
  { echo "FAIL: everything: hostNetwork must reach the plugin and the controller pods"; fail=1; }
must everything 'value: 10.0.0.5$' "kubeletPlugin.extraEnv must reach the plugin container"
must everything 'name: GODEBUG$' "controller.extraEnv must reach the controller container"
mustnot default 'hostNetwork' "pods use the pod network by default"
[ "$(grep -c -- '- --label-mapping=gputopo/gputopo-label-mapping$' "$OUT/everything.yaml")" = 2 ] ||
  { echo "FAIL: everything: the plugin and the controller must both read gputopo/gputopo-label-mapping"; fail=1; }
must everything 'path: /run/nvidia/driver' "driverRoot must be mounted"
must everything -- '--nvidia-cdi-hook-path=/usr/local/nvidia/toolkit/nvidia-cdi-hook$' "a host hook must reach the plugin"
must everything -- '--container-cdi-hook-path=/host-cdi-hook/nvidia-cdi-hook$' "the plugin must see the host hook where its directory is mounted"
must everything 'path: /usr/local/nvidia/toolkit$' "the host hook's directory must be mounted"

render no-probes "$BASE,$POLICIES,DaemonSet=1" --set kubeletPlugin.healthProbePort=0 \
  --set kubeletPlugin.gpuNodesOnly=false
mustnot no-probes '(startup|liveness)Probe:|grpc:' "healthProbePort=0 must drop the plugin's probes"
must no-probes 'readinessProbe:' "the controller's readinessProbe stays"
must no-probes -- '--health-probe-address=$' "healthProbePort=0 must turn the health service off"
mustnot no-probes 'pci-10de' "gpuNodesOnly=false must drop the GPU node affinity"

render minimal "ServiceAccount=1,ClusterRole=1,ClusterRoleBinding=1,Deployment=1,Service=1,DaemonSet=0,DeviceClass=0,ValidatingAdmissionPolicy=0,MutatingAdmissionPolicy=0,PodDisruptionBudget=0,Role=1,ConfigMap=1" \
  --set kubeletPlugin.enabled=false --set deviceClass.create=false \
  --set admission.placementValidation.enabled=false --set admission.schedulingGate.enabled=false \
  --set admission.configValidation.enabled=false --set admission.claimNodeSelector.enabled=false \
  --set controller.replicas=1 --set controller.leaderElection=false
mustnot minimal 'leader-elect=true' "leader election off"

step "values the chart must refuse"
refuse() {
  local why=$1
  shift
  if "$HELM" template gputopo "$CHART" --kube-version "$KUBE_VERSION" "$@" >/dev/null 2>"$OUT/refused.err"; then
    echo "FAIL: accepted: $why"
    fail=1
  else
    echo "ok: refused: $why: $(grep -m1 -E "chart requires|at '/|Error: [^v]" "$OUT/refused.err" | sed 's/^[ -]*//' | cut -c1-110)"
  fi
}
refuse "sim without a profile" --set backend=sim
refuse "sim with profile and nodeProfiles" --set backend=sim --set sim.profile=dgx-h100 --set-json 'sim.nodeProfiles=["pcie-only"]'
refuse "unknown backend" --set backend=cuda
refuse "two replicas without leader election" --set controller.leaderElection=false
refuse "a misspelt value" --set kubeletPlugin.nodeSelecter.a=b
refuse "shared GPUs that are not indexes" --set kubeletPlugin.sharedGPUs=half
refuse "an unknown taint effect" --set kubeletPlugin.taintEffect=PreferNoSchedule
refuse "a relative driver root" --set nvml.driverRoot=run/nvidia/driver
refuse "a relative hook path" --set nvml.cdiHookPath=usr/bin/nvidia-cdi-hook
refuse "Kubernetes older than 1.36 (the oldest supported, docs/versions.md)" --kube-version 1.35.4

step "every supported Kubernetes release is accepted"
for v in 1.36.3 1.37.2; do
  if "$HELM" template gputopo "$CHART" --kube-version "$v" >/dev/null 2>"$OUT/accepted.err"; then
    echo "ok: accepted: Kubernetes $v"
  else
    echo "FAIL: refused Kubernetes $v: $(head -c 300 "$OUT/accepted.err")"
    fail=1
  fi
done

if [ "$fail" -ne 0 ]; then
  printf '\nverify-chart: FAILED\n'
  exit 1
fi
printf '\nverify-chart: OK (manifests in %s)\n' "$OUT"
