package runtime

import (
	"bufio"
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gputopo/gputopo/pkg/topology"
	cluster "github.com/gputopo/gputopo/test/cluster"
	"github.com/gputopo/gputopo/test/e2e/framework"
)

// report is what the probe container prints: its environment, each
// /dev/nvidia* as "path type major:minor" (hex, from stat), the mounts
// under /usr/local, and the driver directory's version file.
const report = `env; echo @@dev; for d in /dev/nvidia*; do stat -c '%n|%F|%t:%T' "$d"; done; ` +
	`echo @@mounts; grep ' /usr/local' /proc/mounts; echo @@version; cat /usr/local/nvidia/version; echo @@end; exec sleep inf`

// seen is what a container reported.
type seen struct {
	env     map[string]string
	devices map[string]string // path -> "character special file|c3:0"
	mounts  map[string][]string
	version string
}

// TestContainerSeesItsClaims runs real containers on containerd and checks
// from inside what the CDI specs of their claims gave them: a container
// with two claims (an NVLink pair and one more GPU) keeps the environment
// of both, has every device node of both specs with the host's device
// numbers and the driver mount; a container with a quarter of a shared GPU
// sees its share and the CUDA MPS limits; and when the pods are deleted,
// the claims' spec files are gone.
func TestContainerSeesItsClaims(t *testing.T) {
	// The share first: a whole-GPU claim may take the shared GPU while it
	// holds no share.
	share := runProbe(t, "share", map[string]string{"share": "gpu-share-quarter"})
	two := runProbe(t, "two-claims", map[string]string{"pair": "gpu-2-nvlink-pair", "one": "gpu-1"})
	ctx := framework.Ctx(t)

	specs := map[string]*cdispec.Spec{}
	claims := map[string]*resourcev1.ResourceClaim{}
	for _, p := range []probe{two, share} {
		for name := range p.claims {
			claim, err := framework.PodClaim(ctx, client, p.pod, name)
			if err != nil {
				t.Fatal(err)
			}
			path, spec, err := framework.FindCDISpec(lc, node, string(claim.UID))
			if err != nil {
				t.Fatalf("pod %s, claim %s: %v", p.pod.Name, name, err)
			}
			t.Logf("pod %s, claim %s: %s", p.pod.Name, name, path)
			specs[p.pod.Name+"/"+name], claims[p.pod.Name+"/"+name] = spec, claim
		}
	}

	// Two claims, one container: each claim's variables arrive, except a
	// claim-wide one the other claim sets to something else (one value
	// wins); the per-device ones never collide.
	pair, one := specEnv(specs["two-claims/pair"]), specEnv(specs["two-claims/one"])
	for _, own := range []struct {
		name        string
		env, others map[string]string
	}{{"pair", pair, one}, {"one", one, pair}} {
		for k, v := range own.env {
			if o, ok := own.others[k]; ok && o != v {
				continue
			}
			if got, ok := two.seen.env[k]; !ok || got != v {
				t.Errorf("container with two claims: %s=%q from claim %s, got %q (set: %t)", k, v, own.name, got, ok)
			}
		}
	}
	gpus := 0
	for k := range two.seen.env {
		if strings.HasPrefix(k, "GPUTOPO_DEVICE_GPU_") {
			gpus++
		}
	}
	if gpus != 3 {
		t.Errorf("container with two claims has %d GPUTOPO_DEVICE_* variables, want 3 (a pair and one): %v", gpus, two.seen.env)
	}

	// Device nodes and mounts, as the specs list them.
	for _, p := range []probe{two, share} {
		var nodes []*cdispec.DeviceNode
		var mounts []*cdispec.Mount
		for name := range p.claims {
			s := specs[p.pod.Name+"/"+name]
			nodes = append(nodes, s.ContainerEdits.DeviceNodes...)
			mounts = append(mounts, s.ContainerEdits.Mounts...)
			for _, d := range s.Devices {
				nodes = append(nodes, d.ContainerEdits.DeviceNodes...)
			}
		}
		if len(nodes) == 0 || len(mounts) == 0 {
			t.Fatalf("pod %s: the specs list %d device nodes and %d mounts; a containerd node's plugin runs with --sim-dev-root and must list both", p.pod.Name, len(nodes), len(mounts))
		}
		want := map[string]string{}
		for _, n := range nodes {
			want[n.Path] = hostDevice(t, n.HostPath)
		}
		for path, dev := range want {
			if got := p.seen.devices[path]; got != dev {
				t.Errorf("pod %s: %s in the container is %q, want %q as on the host", p.pod.Name, path, got, dev)
			}
		}
		for path := range p.seen.devices {
			if _, ok := want[path]; !ok {
				t.Errorf("pod %s: the container has %s, which none of its specs lists", p.pod.Name, path)
			}
		}
		for _, m := range mounts {
			opts, ok := p.seen.mounts[m.ContainerPath]
			if !ok {
				t.Errorf("pod %s: no mount at %s (spec: %s); mounts: %v", p.pod.Name, m.ContainerPath, m.HostPath, p.seen.mounts)
				continue
			}
			if slices.Contains(m.Options, "ro") && !slices.Contains(opts, "ro") {
				t.Errorf("pod %s: mount %s has options %v, want ro as the spec says", p.pod.Name, m.ContainerPath, opts)
			}
			hostVersion, err := os.ReadFile(filepath.Join(m.HostPath, "version"))
			if err != nil {
				t.Fatal(err)
			}
			if p.seen.version != strings.TrimSpace(string(hostVersion)) {
				t.Errorf("pod %s: %s/version reads %q, want the host's %q", p.pod.Name, m.ContainerPath, p.seen.version, hostVersion)
			}
		}
	}
	if len(two.seen.devices) != 4 {
		t.Errorf("container with two claims has devices %v, want nvidiactl and three GPUs", two.seen.devices)
	}

	// A quarter of a shared GPU: its share, and the MPS limits real GPUs get.
	shareEnv := specEnv(specs["share/share"])
	for _, k := range []string{topology.EnvShareMilliGPU, topology.EnvShareMemory, topology.EnvMPSActiveThreadPercentage, topology.EnvMPSPinnedMemoryLimit} {
		if got, want := share.seen.env[k], shareEnv[k]; want == "" || got != want {
			t.Errorf("shared GPU container: %s=%q, want %q (its spec's)", k, got, want)
		}
	}
	if got := share.seen.env[topology.EnvMPSActiveThreadPercentage]; got != "25" {
		t.Errorf("shared GPU container: %s=%q, want 25 for a quarter", topology.EnvMPSActiveThreadPercentage, got)
	}
	if got := share.seen.env[topology.EnvShareMilliGPU]; got != "250" {
		t.Errorf("shared GPU container: %s=%q, want 250", topology.EnvShareMilliGPU, got)
	}
	if _, ok := two.seen.env[topology.EnvMPSActiveThreadPercentage]; ok {
		t.Errorf("container holding whole GPUs has %s", topology.EnvMPSActiveThreadPercentage)
	}

	// Deleting the pods unprepares their claims: the spec files go.
	for _, p := range []probe{two, share} {
		deletePod(t, p.pod.Name)
	}
	for key, claim := range claims {
		framework.Eventually(t, time.Minute, "claim "+key+" unprepared", func() (bool, string) {
			return framework.Unprepared(lc, node, string(claim.UID))
		})
	}
}

type probe struct {
	pod    *corev1.Pod
	claims map[string]string
	seen   seen
}

// runProbe runs a pod with the given claims (name -> template) on the
// containerd node, waits until its container reports, and parses it.
func runProbe(t *testing.T, name string, claims map[string]string) probe {
	t.Helper()
	pod, logs := runPod(t, name, claims, report)
	return probe{pod: pod, claims: claims, seen: parseReport(t, logs)}
}

// runPod runs a pod with the given claims whose container runs the shell
// command cmd, and returns it once its log holds a line "@@end", with
// that log.
func runPod(t *testing.T, name string, claims map[string]string, cmd string) (*corev1.Pod, string) {
	t.Helper()
	// Longer than framework.Ctx: it spans the wait for the pod.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: corev1.PodSpec{
			// The scheduler must see the pod: it allocates the claims.
			NodeSelector:                  map[string]string{"kubernetes.io/hostname": node},
			Tolerations:                   []corev1.Toleration{{Key: cluster.TaintRuntime, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
			TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{
				Name: "probe", Image: cluster.ImageBusybox, ImagePullPolicy: corev1.PullNever,
				Command: []string{"sh", "-c", cmd},
			}},
		},
	}
	for _, c := range slices.Sorted(maps.Keys(claims)) {
		tmpl := claims[c]
		pod.Spec.ResourceClaims = append(pod.Spec.ResourceClaims, corev1.PodResourceClaim{Name: c, ResourceClaimTemplateName: &tmpl})
		pod.Spec.Containers[0].Resources.Claims = append(pod.Spec.Containers[0].Resources.Claims, corev1.ResourceClaim{Name: c})
	}
	created, err := client.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s: %v", name, err)
	}
	t.Cleanup(func() { deletePod(t, name) })
	var logs string
	framework.Eventually(t, 2*time.Minute, "pod "+name+" running and reporting", func() (bool, string) {
		p, err := client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		created = p
		if p.Status.Phase != corev1.PodRunning {
			return false, framework.PodState(p)
		}
		// kubectl logs: the apiserver asks the node's kubelet, which reads
		// the log containerd wrote.
		raw, err := client.CoreV1().Pods(namespace).GetLogs(name, &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			return false, "logs: " + err.Error()
		}
		logs = string(raw)
		return strings.Contains(logs, "@@end"), "log so far: " + logs
	})
	if id := created.Status.ContainerStatuses[0].ContainerID; !strings.HasPrefix(id, "containerd://") {
		t.Fatalf("pod %s: container ID %q, want one containerd ran", name, id)
	}
	return created, logs
}

func parseReport(t *testing.T, logs string) seen {
	t.Helper()
	s := seen{env: map[string]string{}, devices: map[string]string{}, mounts: map[string][]string{}}
	section := "env"
	sc := bufio.NewScanner(strings.NewReader(logs))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "@@") {
			section = line[2:]
			continue
		}
		switch section {
		case "env":
			if k, v, ok := strings.Cut(line, "="); ok {
				s.env[k] = v
			}
		case "dev":
			f := strings.Split(line, "|")
			if len(f) != 3 {
				t.Fatalf("device line %q, want path|type|major:minor", line)
			}
			s.devices[f[0]] = f[1] + "|" + f[2]
		case "mounts":
			f := strings.Fields(line)
			if len(f) >= 4 {
				s.mounts[f[1]] = strings.Split(f[3], ",")
			}
		case "version":
			s.version = strings.TrimSpace(s.version + "\n" + line)
		}
	}
	return s
}

// hostDevice describes a host file as the probe's stat does.
func hostDevice(t *testing.T, path string) string {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatalf("device node the spec lists: %v", err)
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFCHR {
		return fmt.Sprintf("not a character device (mode %o)", st.Mode)
	}
	major, minor := (st.Rdev>>8)&0xfff, (st.Rdev&0xff)|((st.Rdev>>12)&^0xff)
	return "character special file|" + strconv.FormatUint(major, 16) + ":" + strconv.FormatUint(minor, 16)
}

// specEnv is every variable a spec sets, claim-wide and per device.
func specEnv(s *cdispec.Spec) map[string]string {
	env := map[string]string{}
	lists := [][]string{s.ContainerEdits.Env}
	for _, d := range s.Devices {
		lists = append(lists, d.ContainerEdits.Env)
	}
	for _, l := range lists {
		for _, e := range l {
			if k, v, ok := strings.Cut(e, "="); ok {
				env[k] = v
			}
		}
	}
	return env
}

func deletePod(t *testing.T, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err := client.CoreV1().Pods(namespace).Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil {
		return // gone already
	}
	framework.Eventually(t, 2*time.Minute, "pod "+name+" deleted", func() (bool, string) {
		_, err := client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		return err != nil, "still there"
	})
}
