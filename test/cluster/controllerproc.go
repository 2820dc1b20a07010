package cluster

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// controllerProc is the process name of the gputopo controller.
const controllerProc = "controller"

// StartController starts the gputopo controller against the cluster and
// waits until it is ready as the leader: its /readyz says "ok" once it
// holds the leader Lease, has synced its caches and has synced every pod
// group in them once.
func (c *Cluster) StartController() error { return c.StartControllerWith() }

// StartControllerWith starts the controller as StartController does, with
// extra flags after the cluster's ControllerArgs.
func (c *Cluster) StartControllerWith(extra ...string) error {
	if c.cfg.ControllerBin == "" {
		return fmt.Errorf("start controller: the cluster has no controller binary")
	}
	if p := c.procByName(controllerProc); p != nil && !p.exited() {
		return fmt.Errorf("start controller: already running as pid %d", p.pid)
	}
	ports, err := freePorts(1)
	if err != nil {
		return err
	}
	addr := "127.0.0.1:" + strconv.Itoa(ports[0])
	argv := append([]string{c.cfg.ControllerBin,
		"--kubeconfig=" + c.Kubeconfig(),
		"--metrics-address=" + addr,
		"--leader-election-namespace=kube-system",
		"--leader-election-identity=localcluster",
	}, c.cfg.ControllerArgs...)
	argv = append(argv, extra...)
	if err := c.launchOpts(controllerProc, procOpts{workDir: c.dir}, argv...); err != nil {
		return err
	}
	if err := os.WriteFile(c.controllerAddrFile(), []byte(addr), 0o600); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), controllerReadyTimeout)
	defer cancel()
	return c.waitControllerReady(ctx, "http://"+addr+"/readyz")
}

// controllerReadyTimeout bounds start → ready. A controller killed
// without releasing its Lease takes it again at once (the same identity);
// the rest is the caches and one pass over the groups on a loaded machine.
const controllerReadyTimeout = 3 * time.Minute

// waitControllerReady polls the controller's /readyz until it answers 200
// "ok"; 200 "standby" (waiting for the leader Lease) is not enough here.
func (c *Cluster) waitControllerReady(ctx context.Context, url string) error {
	client := &http.Client{Timeout: 2 * time.Second}
	last := ""
	err := c.poll(ctx, controllerReadyTimeout, func() (bool, error) {
		resp, err := client.Get(url)
		if err != nil {
			last = err.Error()
			return false, nil
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		last = fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(body)))
		return resp.StatusCode == http.StatusOK && strings.TrimSpace(string(body)) == "ok", nil
	}, controllerProc)
	if err != nil {
		return fmt.Errorf("wait for the controller to be ready at %s (last answer: %s): %w", url, last, err)
	}
	c.progress("%s ready", controllerProc)
	return nil
}

// ControllerRunning reports whether the controller process runs. It ends
// on its own when it loses its leader Lease (the API server away for
// longer than the renew deadline); in a cluster its Deployment starts it
// again, here nothing does.
func (c *Cluster) ControllerRunning() bool {
	p := c.procByName(controllerProc)
	return p != nil && !p.exited()
}

// ControllerMetricsURL is where the running controller serves /metrics.
func (c *Cluster) ControllerMetricsURL() (string, error) {
	data, err := os.ReadFile(c.controllerAddrFile())
	if err != nil {
		return "", fmt.Errorf("controller address: %w", err)
	}
	return "http://" + string(data) + "/metrics", nil
}

func (c *Cluster) controllerAddrFile() string { return c.dir + "/run/controller.addr" }

// StopController stops the controller with SIGTERM.
func (c *Cluster) StopController() error {
	p := c.procByName(controllerProc)
	if p == nil || p.exited() {
		return fmt.Errorf("controller: %w", ErrNotRunning)
	}
	p.stop(stopTimeout)
	return nil
}

// KillController kills the controller with SIGKILL, as a crash would.
func (c *Cluster) KillController() error {
	p := c.procByName(controllerProc)
	if p == nil || p.exited() {
		return fmt.Errorf("controller: %w", ErrNotRunning)
	}
	p.kill(stopTimeout)
	return nil
}

// applyManifests server-side applies Config.Manifests with the cluster's
// kubectl, so admission policies are in force before anything else runs.
func (c *Cluster) applyManifests(ctx context.Context) error {
	for _, m := range c.cfg.Manifests {
		cmd := exec.CommandContext(ctx, c.bin("kubectl"), "--kubeconfig", c.Kubeconfig(), "apply", "--server-side", "-f", m)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("apply %s: %w: %s", m, err, out)
		}
	}
	if len(c.cfg.Manifests) == 0 {
		return nil
	}
	if err := c.waitPoliciesInForce(ctx); err != nil {
		return fmt.Errorf("wait for the admission policies of %s to take effect: %w", strings.Join(c.cfg.Manifests, ", "), err)
	}
	return nil
}

// Probe policies, created after the manifests: the API server's policy
// sources compile what their informers hold, and an informer sees objects of
// one kind in the order they were created, so once a probe policy acts, every
// policy and binding of its kind created before it does too.
const (
	probeValidating = "gputopo-localcluster-probe-validating"
	probeMutating   = "gputopo-localcluster-probe-mutating"
	probeLabel      = "gputopo.dev/localcluster-probe"
	probePolicies   = `apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: ` + probeValidating + `}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules: [{apiGroups: [""], apiVersions: ["v1"], operations: ["CREATE"], resources: ["configmaps"]}]
  matchConditions: [{name: probe, expression: 'object.metadata.name == "` + probeValidating + `"'}]
  validations: [{expression: "false", message: "` + probeValidating + `"}]
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: ` + probeValidating + `}
spec: {policyName: ` + probeValidating + `, validationActions: [Deny]}
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicy
metadata: {name: ` + probeMutating + `}
spec:
  failurePolicy: Fail
  reinvocationPolicy: Never
  matchConstraints:
    resourceRules: [{apiGroups: [""], apiVersions: ["v1"], operations: ["CREATE"], resources: ["configmaps"]}]
  matchConditions: [{name: probe, expression: 'object.metadata.name == "` + probeMutating + `"'}]
  mutations:
  - patchType: ApplyConfiguration
    applyConfiguration:
      expression: 'Object{metadata: Object.metadata{labels: {"` + probeLabel + `": "mutated"}}}'
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicyBinding
metadata: {name: ` + probeMutating + `}
spec: {policyName: ` + probeMutating + `}
`
)

// waitPoliciesInForce creates the probe policies, waits until dry-run
// ConfigMaps show both acting, and deletes them again.
func (c *Cluster) waitPoliciesInForce(ctx context.Context) error {
	if err := c.kubectlStdin(ctx, probePolicies, "apply", "--server-side", "-f", "-"); err != nil {
		return fmt.Errorf("create probe policies: %w", err)
	}
	cms := c.client.CoreV1().ConfigMaps(metav1.NamespaceDefault)
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	err := c.poll(ctx, time.Minute, func() (bool, error) {
		_, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: probeValidating}}, dryRun)
		if err == nil || !strings.Contains(err.Error(), probeValidating) {
			return false, nil
		}
		cm, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: probeMutating}}, dryRun)
		return err == nil && cm.Labels[probeLabel] == "mutated", nil
	}, "kube-apiserver")
	if err != nil {
		return fmt.Errorf("wait for probe policies to act: %w", err)
	}
	// They match only ConfigMaps of their own names: no need to wait until
	// they are gone.
	if err := c.kubectlStdin(ctx, probePolicies, "delete", "-f", "-"); err != nil {
		return fmt.Errorf("delete probe policies: %w", err)
	}
	return nil
}

func (c *Cluster) kubectlStdin(ctx context.Context, stdin string, args ...string) error {
	cmd := exec.CommandContext(ctx, c.bin("kubectl"), append([]string{"--kubeconfig", c.Kubeconfig()}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return nil
}
