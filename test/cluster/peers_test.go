package cluster

import (
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParsePeers(t *testing.T) {
	got, err := ParsePeers(" jobset,kueue ,")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]Peer{PeerJobSet, PeerKueue}, got); diff != "" {
		t.Errorf("peers (-want +got):\n%s", diff)
	}
	if _, err := ParsePeers("jobset,volcano"); err == nil {
		t.Error("an unknown peer was accepted")
	}
}

func TestConfigRefusesMissingPeers(t *testing.T) {
	dir := t.TempDir()
	err := checkPeers(dir, []Peer{PeerLWS})
	if err == nil {
		t.Fatal("a peer that was not built was accepted")
	}
	if err := checkPeers(dir, []Peer{"volcano"}); err == nil {
		t.Fatal("an unknown peer was accepted")
	}
}

// JobSet and LeaderWorkerSet are built against exactly the module
// versions the Kubernetes binaries of test/cluster's go.mod compile
// (k8s.io/* v0.37.2, grpc, otel, protobuf, ...): every module that provides
// a package to the peer's manager and is in test/cluster's build list has
// the same version there. That is what lets a cold build of JobSet after
// `localcluster build` find all but a few dozen of its packages in the
// build cache (`make e2e` builds it; docs/benchmarks.md, "Build times").
// Kueue v0.17.1 needs newer versions of some of them (gnostic-models
// v0.7.1) and keeps its own.
func TestPeersShareTheKubernetesBuild(t *testing.T) {
	k8s := goModules(t, ".", "list", "-m", "-f", moduleFormat, "all")
	for _, p := range []Peer{PeerJobSet, PeerLWS} {
		spec := peerSpecs[p]
		dir := filepath.Join("peers", string(p))
		peer := goModules(t, dir, "list", "-deps", "-f", "{{with .Module}}"+moduleFormat+"{{end}}", spec.binary.Package)
		if peer[spec.module] != spec.version {
			t.Errorf("%s builds %s %s, want %s", dir, spec.module, peer[spec.module], spec.version)
		}
		shared, differ := sharedModules(k8s, peer)
		for _, path := range differ {
			t.Errorf("%s builds %s %s, the Kubernetes binaries %s: run `go get %s@%s` in test/cluster/%s (then go mod tidy), or %s recompiles it and everything above it",
				dir, path, peer[path], k8s[path], path, k8s[path], dir, p)
		}
		if shared < 50 {
			t.Errorf("%s shares %d modules with the Kubernetes binaries, want most of its %d", dir, shared, len(peer))
		}
	}
}

// The project's own modules (the plugin and controller, the topology
// package, the e2e and benchmark suites) compile every module they share
// with the Kubernetes binaries at the version those binaries compile, so
// that a cold `make test` compiles the Kubernetes libraries (client-go,
// apiserver, component-base, dynamic-resource-allocation, grpc, ...) once,
// in `make unit`, and `localcluster build` finds them in the build cache
// (docs/benchmarks.md, "make test and the local cluster").
func TestProjectSharesTheKubernetesBuild(t *testing.T) {
	k8s := goModules(t, ".", "list", "-m", "-f", moduleFormat, "all")
	for _, dir := range []string{"../..", "../../pkg/clustertopo", "../e2e", "../bench"} {
		own := goModules(t, dir, "list", "-deps", "-test", "-f", "{{with .Module}}"+moduleFormat+"{{end}}", "./...")
		shared, differ := sharedModules(k8s, own)
		for _, path := range differ {
			t.Errorf("%s compiles %s %s, the Kubernetes binaries %s: run `go get %s@%s` in %s (then go mod tidy), or a cold make test compiles it and everything above it twice",
				dir, path, own[path], k8s[path], path, k8s[path], filepath.Clean(filepath.Join("test/cluster", dir)))
		}
		if shared == 0 {
			t.Errorf("%s shares no module with the Kubernetes binaries", dir)
		}
	}
}

// sharedModules counts the modules of own that k8s has too, and lists
// those whose versions differ, sorted.
func sharedModules(k8s, own map[string]string) (int, []string) {
	shared := 0
	var differ []string
	for path, v := range own {
		if want, ok := k8s[path]; ok {
			shared++
			if v != want {
				differ = append(differ, path)
			}
		}
	}
	slices.Sort(differ)
	return shared, differ
}

const moduleFormat = "{{.Path}} {{with .Replace}}{{.Version}}{{else}}{{.Version}}{{end}}"

// goModules runs `go ARGS` in dir and reads its "path version" lines.
func goModules(t *testing.T, dir string, args ...string) map[string]string {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("go %s in %s: %v\n%s", strings.Join(args, " "), dir, err, stderr)
	}
	m := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if path, version, ok := strings.Cut(line, " "); ok && version != "" {
			m[path] = version
		}
	}
	return m
}
