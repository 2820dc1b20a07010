package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
)

// Peer is a workload controller of the Kubernetes ecosystem that a cluster
// runs beside gputopo when its Config asks for it: built from the Go module
// proxy like the Kubernetes binaries, its CRDs installed from its module,
// its manager run as a local process against the cluster's API server with
// its webhooks served on 127.0.0.1 with a certificate of the cluster's CA.
type Peer string

const (
	// PeerJobSet is the JobSet controller, sigs.k8s.io/jobset.
	PeerJobSet Peer = "jobset"
	// PeerLWS is the LeaderWorkerSet controller, sigs.k8s.io/lws.
	PeerLWS Peer = "lws"
	// PeerKueue is Kueue, sigs.k8s.io/kueue, with its batch/v1 Job and
	// plain-pod integrations.
	PeerKueue Peer = "kueue"
)

// Peers lists every peer the harness can run, in start order.
var Peers = []Peer{PeerJobSet, PeerLWS, PeerKueue}

// Peer versions, pinned in the modules under test/cluster/peers: the newest
// the Go module proxy serves whose sources download (lws v0.10.0's zip is
// refused, kueue v0.17.2 is not served).
const (
	JobSetVersion = "v0.12.0"
	LWSVersion    = "v0.9.0"
	KueueVersion  = "v0.17.1"
)

// peerSpec says how to build and run one peer.
type peerSpec struct {
	peer    Peer
	module  string // Go module the binary and manifests come from
	version string
	binary  Binary
	// versionPkg takes the version through -X versionPkg.GitVersion.
	versionPkg string
	// crdDir and webhooks are paths inside the module.
	crdDir, webhooks string
	// namespace is where the manager expects to live (created, empty).
	namespace string
	// configAPI is the apiVersion of the manager's Configuration file;
	// extraConfig is appended to it.
	configAPI, extraConfig string
	// args are added to the manager's command line.
	args []string
	// certMount is a path where the manager insists on reading a
	// certificate pair whatever its configuration says: the webhook's pair
	// is bind-mounted there in a private mount namespace.
	certMount string
	// probe is an object that a dry-run create shows the peer's mutating
	// webhook has changed once the API server calls it.
	probe func(ns string) (schema.GroupVersionResource, *unstructured.Unstructured, func(*unstructured.Unstructured) bool)
}

var peerSpecs = map[Peer]peerSpec{
	PeerJobSet: {
		peer: PeerJobSet, module: "sigs.k8s.io/jobset", version: JobSetVersion,
		binary:     Binary{"jobset-controller", "sigs.k8s.io/jobset"},
		versionPkg: "sigs.k8s.io/jobset/pkg/version",
		crdDir:     "config/components/crd/bases", webhooks: "config/components/webhook/manifests.yaml",
		namespace: "jobset-system", configAPI: "config.jobset.x-k8s.io/v1alpha1",
		probe: jobSetProbe,
	},
	PeerLWS: {
		peer: PeerLWS, module: "sigs.k8s.io/lws", version: LWSVersion,
		binary:     Binary{"lws-controller", "sigs.k8s.io/lws/cmd"},
		versionPkg: "sigs.k8s.io/lws/pkg/version",
		crdDir:     "config/crd/bases", webhooks: "config/webhook/manifests.yaml",
		namespace: "lws-system", configAPI: "config.lws.x-k8s.io/v1alpha1",
		probe: lwsProbe,
	},
	PeerKueue: {
		peer: PeerKueue, module: "sigs.k8s.io/kueue", version: KueueVersion,
		binary:     Binary{"kueue-controller", "sigs.k8s.io/kueue/cmd/kueue"},
		versionPkg: "sigs.k8s.io/kueue/pkg/version",
		crdDir:     "config/components/crd/bases", webhooks: "config/components/webhook/manifests.yaml",
		namespace: "kueue-system", configAPI: "config.kueue.x-k8s.io/v1beta2",
		// Only the integrations the suites use: the others' webhooks
		// answer as no-ops.
		extraConfig: "integrations:\n  frameworks: [batch/job, pod]\n",
		// The visibility API server would need an APIService and a port
		// of its own; nothing here reads pending workloads through it.
		args: []string{"--feature-gates=VisibilityOnDemand=false"},
		// With its own certificate management off, Kueue reads the metrics
		// server's pair from this fixed path, even with metrics off.
		certMount: "/etc/kueue/metrics/certs",
		probe:     kueueProbe,
	},
}

// DefaultPeersBinDir is $GPUTOPO_PEERS_BIN, or ~/.cache/gputopo/peers/bin:
// each peer's manager, and its CRDs and webhook configurations under
// manifests/PEER.
func DefaultPeersBinDir() string {
	if d := os.Getenv("GPUTOPO_PEERS_BIN"); d != "" {
		return d
	}
	home, err := os.UserHomeDir()
	if err != nil {
		home = os.TempDir()
	}
	return filepath.Join(home, ".cache", "gputopo", "peers", "bin")
}

// ParsePeers reads a comma-separated list of peer names.
func ParsePeers(s string) ([]Peer, error) {
	var out []Peer
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if _, ok := peerSpecs[Peer(f)]; !ok {
			return nil, fmt.Errorf("unknown peer %q: want %s", f, peerNames())
		}
		out = append(out, Peer(f))
	}
	return out, nil
}

func peerNames() string {
	var names []string
	for _, p := range Peers {
		names = append(names, string(p))
	}
	return strings.Join(names, ", ")
}

func peerLDFlags(s peerSpec) string {
	return "-s -w -X " + s.versionPkg + ".GitVersion=" + s.version
}

func peerToolset(s peerSpec, outDir string) toolset {
	return toolset{name: string(s.peer), version: s.version, subdir: filepath.Join("peers", string(s.peer)),
		outDir: outDir, ldflags: peerLDFlags(s), binaries: []Binary{s.binary}}
}

// BuildPeers builds the managers of peers (every peer if empty) into
// PeersOutDir, skipping those whose stamp is current, and copies each
// one's CRDs and webhook configurations from the module cache beside them.
func BuildPeers(ctx context.Context, opts BuildOptions, peers ...Peer) error {
	if opts.PeersOutDir == "" {
		opts.PeersOutDir = DefaultPeersBinDir()
	}
	if err := opts.fillCommon(); err != nil {
		return err
	}
	if len(peers) == 0 {
		peers = Peers
	}
	goVersion, err := exec.CommandContext(ctx, "go", "env", "GOVERSION").Output()
	if err != nil {
		return fmt.Errorf("ask go for its version: %w", err)
	}
	for _, p := range peers {
		s, ok := peerSpecs[p]
		if !ok {
			return fmt.Errorf("unknown peer %q: want %s", p, peerNames())
		}
		set := peerToolset(s, opts.PeersOutDir)
		if err := buildSet(ctx, opts, strings.TrimSpace(string(goVersion)), set); err != nil {
			return err
		}
		if err := copyPeerManifests(ctx, filepath.Join(opts.ModuleDir, set.subdir), s, opts.PeersOutDir); err != nil {
			return err
		}
	}
	return nil
}

// copyPeerManifests copies the CRDs and the webhook configurations of the
// module version the peer's go.mod requires into DIR/manifests/PEER.
func copyPeerManifests(ctx context.Context, moduleDir string, s peerSpec, outDir string) error {
	cmd := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", s.module)
	cmd.Dir = moduleDir
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("find module %s in the module cache: %w", s.module, err)
	}
	src := strings.TrimSpace(string(out))
	dst := filepath.Join(outDir, "manifests", string(s.peer))
	if err := os.RemoveAll(dst); err != nil {
		return fmt.Errorf("clean %s: %w", dst, err)
	}
	if err := os.MkdirAll(filepath.Join(dst, "crds"), 0o755); err != nil {
		return fmt.Errorf("create %s: %w", dst, err)
	}
	crds, err := filepath.Glob(filepath.Join(src, s.crdDir, "*.yaml"))
	if err != nil || len(crds) == 0 {
		return fmt.Errorf("no CRDs of %s in %s: %v", s.module, filepath.Join(src, s.crdDir), err)
	}
	for _, f := range append(crds, filepath.Join(src, s.webhooks)) {
		data, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("read %s: %w", f, err)
		}
		to := filepath.Join(dst, "crds", filepath.Base(f))
		if f == filepath.Join(src, s.webhooks) {
			to = filepath.Join(dst, "webhooks.yaml")
		}
		if err := os.WriteFile(to, data, 0o644); err != nil {
			return fmt.Errorf("copy %s: %w", f, err)
		}
	}
	return nil
}

// checkPeers checks that every peer asked for was built.
func checkPeers(binDir string, peers []Peer) error {
	for _, p := range peers {
		s, ok := peerSpecs[p]
		if !ok {
			return fmt.Errorf("cluster config: unknown peer %q: want %s", p, peerNames())
		}
		for _, f := range []string{s.binary.Name, filepath.Join("manifests", string(p), "webhooks.yaml")} {
			if _, err := os.Stat(filepath.Join(binDir, f)); err != nil {
				return fmt.Errorf("find peer %s (run `localcluster build-peers` or `make peer-binaries`): %w", p, err)
			}
		}
	}
	return nil
}

func peerProc(p Peer) string { return "peer-" + string(p) }

// startPeers installs each peer's CRDs, starts its manager and registers
// its webhooks, and returns once the API server calls them.
func (c *Cluster) startPeers(ctx context.Context) error {
	if len(c.cfg.Peers) == 0 {
		return nil
	}
	dyn, err := dynamic.NewForConfig(c.rest)
	if err != nil {
		return fmt.Errorf("create dynamic client: %w", err)
	}
	for _, p := range c.cfg.Peers {
		if err := c.startPeer(ctx, dyn, peerSpecs[p]); err != nil {
			return fmt.Errorf("start peer %s: %w", p, err)
		}
	}
	return nil
}

func (c *Cluster) startPeer(ctx context.Context, dyn dynamic.Interface, s peerSpec) error {
	t := time.Now()
	manifests := filepath.Join(c.cfg.PeersBinDir, "manifests", string(s.peer))
	// Server-side: Kueue's CRDs are too large for the last-applied annotation.
	cmd := exec.CommandContext(ctx, c.bin("kubectl"), "--kubeconfig", c.Kubeconfig(), "apply", "--server-side", "-f", filepath.Join(manifests, "crds"))
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("apply CRDs: %w: %s", err, out)
	}
	// kubectl wait fails, rather than waits, on a CRD whose status has no
	// conditions yet: ask again until every CRD is Established.
	var waitOut []byte
	err := c.poll(ctx, time.Minute, func() (bool, error) {
		cmd := exec.CommandContext(ctx, c.bin("kubectl"), "--kubeconfig", c.Kubeconfig(), "wait", "--for=condition=Established", "--timeout=10s", "-f", filepath.Join(manifests, "crds"))
		var err error
		waitOut, err = cmd.CombinedOutput()
		return err == nil, nil
	}, "kube-apiserver")
	if err != nil {
		return fmt.Errorf("wait for CRDs to be Established: %w: %s", err, waitOut)
	}
	if _, err := c.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: s.namespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", s.namespace, err)
	}

	dir := filepath.Join(c.dir, "peers", string(s.peer))
	certDir := filepath.Join(dir, "certs")
	if err := os.MkdirAll(certDir, 0o755); err != nil {
		return err
	}
	// controller-runtime's webhook server reads tls.crt and tls.key.
	if _, err := c.pki.CA.Issue(certDir, "tls", CertRequest{CommonName: string(s.peer) + "-webhook", IPs: loopbackIPs(), Server: true}); err != nil {
		return err
	}
	ports, err := freePorts(2)
	if err != nil {
		return err
	}
	webhookPort, healthPort := ports[0], ports[1]
	config := fmt.Sprintf(`apiVersion: %s
kind: Configuration
health:
  healthProbeBindAddress: 127.0.0.1:%d
metrics:
  bindAddress: "0"
webhook:
  host: 127.0.0.1
  port: %d
  certDir: %s
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: false
%s`, s.configAPI, healthPort, webhookPort, certDir, s.extraConfig)
	configFile := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(configFile, []byte(config), 0o644); err != nil {
		return fmt.Errorf("write configuration: %w", err)
	}
	argv := append([]string{filepath.Join(c.cfg.PeersBinDir, s.binary.Name),
		"--kubeconfig=" + c.Kubeconfig(), "--config=" + configFile}, s.args...)
	if s.certMount != "" {
		// The mount point must exist on the host; it stays empty there.
		if err := os.MkdirAll(s.certMount, 0o755); err != nil {
			return fmt.Errorf("create mount point %s for %s's certificates: %w", s.certMount, s.peer, err)
		}
		argv = append([]string{"unshare", "--mount", "--propagation", "private", "--",
			"sh", "-c", `mount --bind "$0" "$1" && shift && exec "$@"`, certDir, s.certMount}, argv...)
	}
	if err := c.launchOpts(peerProc(s.peer), procOpts{workDir: dir}, argv...); err != nil {
		return err
	}
	if err := c.waitHTTP(ctx, peerProc(s.peer), "http://127.0.0.1:"+strconv.Itoa(healthPort)+"/readyz", 2*time.Minute); err != nil {
		return err
	}
	if err := c.registerWebhooks(ctx, s, filepath.Join(manifests, "webhooks.yaml"), webhookPort); err != nil {
		return err
	}
	// In default: Kueue leaves Jobs in its own namespace alone.
	gvr, obj, acted := s.probe(metav1.NamespaceDefault)
	err = c.poll(ctx, time.Minute, func() (bool, error) {
		got, err := dyn.Resource(gvr).Namespace(metav1.NamespaceDefault).Create(ctx, obj, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil && acted(got), nil
	}, peerProc(s.peer))
	if err != nil {
		return fmt.Errorf("wait for the API server to call the webhooks of %s: %w", s.peer, err)
	}
	c.progress("peer %s %s running, webhooks in force (%s)", s.peer, s.version, time.Since(t).Round(100*time.Millisecond))
	return nil
}

func loopbackIPs() []net.IP { return []net.IP{net.ParseIP("127.0.0.1")} }

// registerWebhooks creates the peer's webhook configurations from its
// module, each webhook pointed at https://127.0.0.1:PORT with the cluster's
// CA, instead of the Service the peer's own installation uses.
func (c *Cluster) registerWebhooks(ctx context.Context, s peerSpec, path string, port int) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read webhook configurations: %w", err)
	}
	ca, err := os.ReadFile(c.pki.CA.CertFile)
	if err != nil {
		return fmt.Errorf("read cluster CA: %w", err)
	}
	point := func(cc *admissionregistrationv1.WebhookClientConfig) error {
		if cc.Service == nil || cc.Service.Path == nil {
			return fmt.Errorf("webhook without a service path in %s", path)
		}
		url := fmt.Sprintf("https://127.0.0.1:%d%s", port, *cc.Service.Path)
		*cc = admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: ca}
		return nil
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(string(data)), 4096)
	for {
		var raw unstructured.Unstructured
		if err := dec.Decode(&raw.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("decode %s: %w", path, err)
		}
		if raw.Object == nil {
			continue
		}
		name := string(s.peer) + "-" + raw.GetName()
		switch raw.GetKind() {
		case "MutatingWebhookConfiguration":
			var cfg admissionregistrationv1.MutatingWebhookConfiguration
			if err := fromUnstructured(&raw, &cfg); err != nil {
				return err
			}
			cfg.Name = name
			for i := range cfg.Webhooks {
				if err := point(&cfg.Webhooks[i].ClientConfig); err != nil {
					return err
				}
			}
			if _, err := c.client.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, &cfg, metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("create %s: %w", name, err)
			}
		case "ValidatingWebhookConfiguration":
			var cfg admissionregistrationv1.ValidatingWebhookConfiguration
			if err := fromUnstructured(&raw, &cfg); err != nil {
				return err
			}
			cfg.Name = name
			for i := range cfg.Webhooks {
				if err := point(&cfg.Webhooks[i].ClientConfig); err != nil {
					return err
				}
			}
			if _, err := c.client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, &cfg, metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("create %s: %w", name, err)
			}
		default:
			return fmt.Errorf("%s: unexpected %s %s", path, raw.GetKind(), raw.GetName())
		}
	}
}

func fromUnstructured(u *unstructured.Unstructured, into any) error {
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, into); err != nil {
		return fmt.Errorf("decode %s %s: %w", u.GetKind(), u.GetName(), err)
	}
	return nil
}

// PeerRunning reports whether the peer's manager runs.
func (c *Cluster) PeerRunning(p Peer) bool {
	pr := c.procByName(peerProc(p))
	return pr != nil && !pr.exited()
}

// PeerLog is the path of the peer manager's log.
func (c *Cluster) PeerLog(p Peer) string { return c.logPath(peerProc(p)) }

// PeerVersion is the version of the peer the harness builds.
func PeerVersion(p Peer) string { return peerSpecs[p].version }

func probeObject(apiVersion, kind, ns string, spec map[string]any, labels map[string]any) *unstructured.Unstructured {
	meta := map[string]any{"name": "gputopo-localcluster-probe", "namespace": ns}
	if labels != nil {
		meta["labels"] = labels
	}
	return &unstructured.Unstructured{Object: map[string]any{"apiVersion": apiVersion, "kind": kind, "metadata": meta, "spec": spec}}
}

func probeContainer() []any {
	return []any{map[string]any{"name": "c", "image": "probe"}}
}

// jobSetProbe: JobSet's defaulting webhook gives pods restartPolicy
// OnFailure; the CRD's schema leaves it empty.
func jobSetProbe(ns string) (schema.GroupVersionResource, *unstructured.Unstructured, func(*unstructured.Unstructured) bool) {
	obj := probeObject("jobset.x-k8s.io/v1alpha2", "JobSet", ns, map[string]any{
		"replicatedJobs": []any{map[string]any{"name": "w", "replicas": int64(1), "template": map[string]any{
			"spec": map[string]any{"template": map[string]any{"spec": map[string]any{"containers": probeContainer()}}}}}},
	}, nil)
	return schema.GroupVersionResource{Group: "jobset.x-k8s.io", Version: "v1alpha2", Resource: "jobsets"}, obj,
		func(u *unstructured.Unstructured) bool {
			jobs, _, _ := unstructured.NestedSlice(u.Object, "spec", "replicatedJobs")
			if len(jobs) == 0 {
				return false
			}
			job, _ := jobs[0].(map[string]any)
			rp, _, _ := unstructured.NestedString(job, "template", "spec", "template", "spec", "restartPolicy")
			return rp == "OnFailure"
		}
}

// lwsProbe: LWS's defaulting webhook sets the subdomain policy.
func lwsProbe(ns string) (schema.GroupVersionResource, *unstructured.Unstructured, func(*unstructured.Unstructured) bool) {
	obj := probeObject("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", ns, map[string]any{
		"leaderWorkerTemplate": map[string]any{"size": int64(2), "workerTemplate": map[string]any{"spec": map[string]any{"containers": probeContainer()}}},
	}, nil)
	return schema.GroupVersionResource{Group: "leaderworkerset.x-k8s.io", Version: "v1", Resource: "leaderworkersets"}, obj,
		func(u *unstructured.Unstructured) bool {
			p, _, _ := unstructured.NestedString(u.Object, "spec", "networkConfig", "subdomainPolicy")
			return p != ""
		}
}

// kueueProbe: Kueue's Job webhook suspends a Job that names a queue.
func kueueProbe(ns string) (schema.GroupVersionResource, *unstructured.Unstructured, func(*unstructured.Unstructured) bool) {
	obj := probeObject("batch/v1", "Job", ns, map[string]any{
		"suspend":  false,
		"template": map[string]any{"spec": map[string]any{"restartPolicy": "Never", "containers": probeContainer()}},
	}, map[string]any{"kueue.x-k8s.io/queue-name": "probe"})
	return schema.GroupVersionResource{Group: "batch", Version: "v1", Resource: "jobs"}, obj,
		func(u *unstructured.Unstructured) bool {
			s, _, _ := unstructured.NestedBool(u.Object, "spec", "suspend")
			return s
		}
}
