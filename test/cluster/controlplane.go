package cluster

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

const (
	serviceCIDR = "10.96.0.0/16"
	serviceIP   = "10.96.0.1"
	saIssuer    = "https://kubernetes.default.svc.cluster.local"
)

// DefaultFeatureGates are the gates every component of a cluster gets
// unless its Config adds others: none. A cluster runs the version's own
// defaults, as a managed cluster does; a test about an alpha or off-by-default
// gate (DRAListTypeAttributes for the plugin's --numa-node-list) turns it
// on in its own Config.FeatureGates. The alpha Workload gates
// (GenericWorkload, WorkloadWithJob, ...) stay off: gputopo places groups
// itself, by allocating their claims, and needs no scheduler pod groups.
var DefaultFeatureGates = map[string]bool{}

// RuntimeConfig is the apiserver's --runtime-config for a Kubernetes
// version: the Job controller writes Workload/PodGroup (scheduling.k8s.io
// v1beta1 and v1alpha3 in 1.37, v1alpha2 in 1.36) when the gates are on.
func RuntimeConfig(version string) string {
	if minorOf(version) == "1.36" {
		return "scheduling.k8s.io/v1alpha2=true"
	}
	return "scheduling.k8s.io/v1beta1=true,scheduling.k8s.io/v1alpha3=true"
}

// binaryVersion is the version a Kubernetes binary was built as, from its
// --version ("Kubernetes v1.36.3").
func binaryVersion(bin string) (string, error) {
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("ask %s for its version: %w", bin, err)
	}
	v, ok := strings.CutPrefix(strings.TrimSpace(string(out)), "Kubernetes ")
	if !ok || !strings.HasPrefix(v, "v1.") {
		return "", fmt.Errorf("%s --version printed %q, not \"Kubernetes v1.N.P\"", bin, strings.TrimSpace(string(out)))
	}
	return v, nil
}

// Ports are the control plane's listening ports, all on 127.0.0.1.
type Ports struct {
	Etcd              int `json:"etcd"`
	EtcdPeer          int `json:"etcdPeer"`
	APIServer         int `json:"apiServer"`
	ControllerManager int `json:"controllerManager"`
	Scheduler         int `json:"scheduler"`
}

// freePorts reserves n distinct free TCP ports on 127.0.0.1. The listeners are
// closed before returning, so another process could take a port in between;
// on a test machine that is rare enough.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func featureGateFlag(gates map[string]bool) string {
	kv := make([]string, 0, len(gates))
	for k, v := range gates {
		kv = append(kv, k+"="+strconv.FormatBool(v))
	}
	sort.Strings(kv)
	return strings.Join(kv, ",")
}

func (c *Cluster) startControlPlane(ctx context.Context) error {
	ports, err := freePorts(5)
	if err != nil {
		return err
	}
	c.ports = Ports{Etcd: ports[0], EtcdPeer: ports[1], APIServer: ports[2], ControllerManager: ports[3], Scheduler: ports[4]}
	c.server = fmt.Sprintf("https://127.0.0.1:%d", c.ports.APIServer)

	c.progress("creating certificates")
	pki, err := NewPKI(filepath.Join(c.dir, "pki"))
	if err != nil {
		return fmt.Errorf("create certificates: %w", err)
	}
	c.pki = pki
	if err := pki.IssueKubeconfig(c.Kubeconfig(), c.server, "kubernetes-admin", "system:masters"); err != nil {
		return err
	}
	cmKubeconfig := filepath.Join(c.dir, "pki", "controller-manager.kubeconfig")
	if err := pki.IssueKubeconfig(cmKubeconfig, c.server, "system:kube-controller-manager"); err != nil {
		return err
	}
	schedKubeconfig := filepath.Join(c.dir, "pki", "scheduler.kubeconfig")
	if err := pki.IssueKubeconfig(schedKubeconfig, c.server, "system:kube-scheduler"); err != nil {
		return err
	}
	gates := featureGateFlag(c.cfg.FeatureGates)

	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", c.ports.Etcd)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", c.ports.EtcdPeer)
	if err := c.launch("etcd", c.bin("etcd"),
		"--name=default", "--data-dir="+filepath.Join(c.dir, "etcd"),
		"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=default="+peerURL, "--unsafe-no-fsync", "--log-level=warn",
	); err != nil {
		return err
	}
	if err := c.waitHTTP(ctx, "etcd", etcdURL+"/health", 30*time.Second); err != nil {
		return err
	}

	p := pki
	hosts, err := c.writeHosts()
	if err != nil {
		return err
	}
	// The apiserver reaches a kubelet (logs, exec) at the node's Hostname
	// address, its name: a private /etc/hosts maps every node name to
	// 127.0.0.1, where each kubelet listens on its own port.
	if err := c.launch("kube-apiserver", "unshare", "--mount", "--propagation", "private", "--",
		"sh", "-c", `mount --bind "$0" /etc/hosts && exec "$@"`, hosts,
		c.bin("kube-apiserver"),
		"--etcd-servers="+etcdURL,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", c.ports.APIServer),
		"--cert-dir="+filepath.Join(c.dir, "pki", "apiserver-generated"),
		"--tls-cert-file="+p.APIServer.CertFile, "--tls-private-key-file="+p.APIServer.KeyFile,
		"--client-ca-file="+p.CA.CertFile,
		"--kubelet-client-certificate="+p.APIServerKubeletClient.CertFile,
		"--kubelet-client-key="+p.APIServerKubeletClient.KeyFile,
		"--service-account-key-file="+p.ServiceAccountPub,
		"--service-account-signing-key-file="+p.ServiceAccountKey,
		"--service-account-issuer="+saIssuer,
		"--service-cluster-ip-range="+serviceCIDR,
		"--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
		"--allow-privileged=true", "--endpoint-reconciler-type=none",
		"--requestheader-client-ca-file="+p.FrontProxy.CertFile,
		"--requestheader-allowed-names=front-proxy-client",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-username-headers=X-Remote-User",
		"--proxy-client-cert-file="+p.FrontProxyClient.CertFile,
		"--proxy-client-key-file="+p.FrontProxyClient.KeyFile,
		"--feature-gates="+gates, "--runtime-config="+RuntimeConfig(c.version),
	); err != nil {
		return err
	}
	if err := c.connect(); err != nil {
		return err
	}
	if err := c.waitReadyz(ctx, 90*time.Second); err != nil {
		return err
	}

	if err := c.launch("kube-controller-manager", c.bin("kube-controller-manager"),
		"--kubeconfig="+cmKubeconfig,
		"--authentication-kubeconfig="+cmKubeconfig, "--authorization-kubeconfig="+cmKubeconfig,
		"--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", c.ports.ControllerManager),
		"--cert-dir="+filepath.Join(c.dir, "pki", "controller-manager-generated"),
		"--leader-elect=false", "--use-service-account-credentials=true",
		"--service-account-private-key-file="+p.ServiceAccountKey,
		"--root-ca-file="+p.CA.CertFile,
		"--cluster-signing-cert-file="+p.CA.CertFile,
		"--cluster-signing-key-file="+filepath.Join(c.dir, "pki", "ca.key"),
		"--requestheader-client-ca-file="+p.FrontProxy.CertFile,
		"--client-ca-file="+p.CA.CertFile,
		// Fake nodes have no kubelet to renew their lease; a huge grace
		// period keeps them Ready while the lifecycle controller still
		// removes the initial not-ready taint.
		"--node-monitor-grace-period=87600h",
		"--feature-gates="+gates,
	); err != nil {
		return err
	}
	if err := c.launch("kube-scheduler", c.bin("kube-scheduler"),
		"--kubeconfig="+schedKubeconfig,
		"--authentication-kubeconfig="+schedKubeconfig, "--authorization-kubeconfig="+schedKubeconfig,
		"--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", c.ports.Scheduler),
		"--cert-dir="+filepath.Join(c.dir, "pki", "scheduler-generated"),
		"--leader-elect=false",
		"--requestheader-client-ca-file="+p.FrontProxy.CertFile,
		"--client-ca-file="+p.CA.CertFile,
		"--feature-gates="+gates,
	); err != nil {
		return err
	}
	if err := c.waitHTTP(ctx, "kube-controller-manager", fmt.Sprintf("https://127.0.0.1:%d/healthz", c.ports.ControllerManager), 60*time.Second); err != nil {
		return err
	}
	if err := c.waitHTTP(ctx, "kube-scheduler", fmt.Sprintf("https://127.0.0.1:%d/healthz", c.ports.Scheduler), 60*time.Second); err != nil {
		return err
	}
	return c.waitDefaultServiceAccount(ctx, 60*time.Second)
}

// writeHosts writes the apiserver's /etc/hosts: localhost and every node
// at 127.0.0.1.
func (c *Cluster) writeHosts() (string, error) {
	var b strings.Builder
	b.WriteString("127.0.0.1 localhost\n::1 localhost\n")
	for _, name := range c.order {
		fmt.Fprintf(&b, "127.0.0.1 %s\n", name)
	}
	path := filepath.Join(c.dir, "hosts")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return "", fmt.Errorf("write the apiserver's hosts file: %w", err)
	}
	return path, nil
}

// waitHTTP polls url until it answers 200, failing early if the process dies.
func (c *Cluster) waitHTTP(ctx context.Context, name, url string, timeout time.Duration) error {
	client := &http.Client{
		Timeout:   2 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, // local health probe only
	}
	err := c.poll(ctx, timeout, func() (bool, error) {
		resp, err := client.Get(url)
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	}, name)
	if err != nil {
		return fmt.Errorf("wait for %s to be healthy at %s: %w", name, url, err)
	}
	c.progress("%s healthy", name)
	return nil
}

func (c *Cluster) waitReadyz(ctx context.Context, timeout time.Duration) error {
	err := c.poll(ctx, timeout, func() (bool, error) {
		body, err := c.client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err == nil && string(body) == "ok", nil
	}, "kube-apiserver")
	if err != nil {
		return fmt.Errorf("wait for kube-apiserver /readyz: %w", err)
	}
	c.progress("kube-apiserver ready")
	return nil
}

func (c *Cluster) waitDefaultServiceAccount(ctx context.Context, timeout time.Duration) error {
	err := c.poll(ctx, timeout, func() (bool, error) {
		_, err := c.client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil, nil
	}, "kube-controller-manager", "kube-apiserver")
	if err != nil {
		return fmt.Errorf("wait for the default ServiceAccount: %w", err)
	}
	c.progress("default ServiceAccount exists")
	return nil
}

// poll runs cond every 200ms until it is true, the timeout passes, or one of
// the named processes exits; the error carries the tail of that process's
// log (of the first named one on a timeout).
func (c *Cluster) poll(ctx context.Context, timeout time.Duration, cond func() (bool, error), procNames ...string) error {
	culprit := ""
	if len(procNames) > 0 {
		culprit = procNames[0]
	}
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		for _, name := range procNames {
			if p := c.procByName(name); p != nil && p.exited() {
				culprit = name
				return false, fmt.Errorf("%s exited (%v)", name, p.exitErr())
			}
		}
		return cond()
	})
	if err != nil && culprit != "" {
		return &StartError{Proc: culprit, Log: c.logPath(culprit), Err: err}
	}
	return err
}

// StartError says which process kept the cluster from starting, with the
// tail of its log.
type StartError struct {
	Proc string
	Log  string
	Err  error
}

func (e *StartError) Error() string {
	return fmt.Sprintf("%s: %v\n--- last lines of %s ---\n%s", e.Proc, e.Err, e.Log, tailFile(e.Log, 30))
}

func (e *StartError) Unwrap() error { return e.Err }
