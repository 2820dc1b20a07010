package cluster

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// Every supported release is found by its version and by its minor
// release; anything else is refused with the list.
func TestLookupRelease(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"v1.37.2", "v1.37.2"}, {"1.37.2", "v1.37.2"}, {"1.37", "v1.37.2"}, {"v1.37", "v1.37.2"},
		{"v1.36.3", "v1.36.3"}, {"1.36", "v1.36.3"}, {" v1.36 ", "v1.36.3"},
	} {
		r, err := LookupRelease(tc.in)
		if err != nil || r.Version != tc.want {
			t.Errorf("LookupRelease(%q) = %v, %v; want %s", tc.in, r.Version, err, tc.want)
		}
	}
	for _, bad := range []string{"1.35", "v1.37.1", "1.3", "latest", ""} {
		_, err := LookupRelease(bad)
		if err == nil || !strings.Contains(err.Error(), "v1.37.2, v1.36.3") {
			t.Errorf("LookupRelease(%q) = %v, want an error listing the releases", bad, err)
		}
	}
	if Releases[0].Version != KubernetesVersion || Releases[0].Module != "." {
		t.Errorf("the first release is %+v, want the newest, %s, from test/cluster's own go.mod", Releases[0], KubernetesVersion)
	}
}

// GPUTOPO_K8S_VERSION picks the release, and with it the binary directory.
func TestSelectedAndBinDir(t *testing.T) {
	t.Setenv("GPUTOPO_K8S_BIN", "")
	t.Setenv(VersionEnv, "1.36")
	if r, err := Selected(); err != nil || r.Version != "v1.36.3" {
		t.Errorf("Selected() with %s=1.36 = %v, %v", VersionEnv, r, err)
	}
	if d := DefaultBinDir(); !strings.HasSuffix(d, filepath.Join("gputopo", "k8s-v1.36.3", "bin")) {
		t.Errorf("DefaultBinDir() with %s=1.36 = %s", VersionEnv, d)
	}
	t.Setenv(VersionEnv, "")
	if d := DefaultBinDir(); !strings.HasSuffix(d, filepath.Join("gputopo", "k8s-"+KubernetesVersion, "bin")) {
		t.Errorf("DefaultBinDir() = %s, want the newest release's", d)
	}
	t.Setenv(VersionEnv, "1.35")
	if _, err := Selected(); err == nil || !strings.Contains(err.Error(), VersionEnv) {
		t.Errorf("Selected() with %s=1.35 = %v, want an error naming the variable", VersionEnv, err)
	}
	t.Setenv("GPUTOPO_K8S_BIN", "/opt/k8s")
	if d := DefaultBinDir(); d != "/opt/k8s" {
		t.Errorf("DefaultBinDir() with GPUTOPO_K8S_BIN = %s", d)
	}
}

// The link flags stamp each release's own version (what /version and
// kubectl version report), and differ only there between releases.
func TestLDFlagsStampTheVersion(t *testing.T) {
	for _, tc := range []struct{ version, minor string }{{"v1.37.2", "37"}, {"v1.36.3", "36"}} {
		f := LDFlags(tc.version)
		for _, pkg := range []string{"k8s.io/component-base/version", "k8s.io/client-go/pkg/version"} {
			for _, want := range []string{pkg + ".gitVersion=" + tc.version, pkg + ".gitMajor=1", pkg + ".gitMinor=" + tc.minor} {
				if !strings.Contains(f, "-X "+want+" ") {
					t.Errorf("LDFlags(%s) = %q: no -X %s", tc.version, f, want)
				}
			}
		}
	}
	strip := regexp.MustCompile(`v1\.3[67]\.[0-9]+|gitMinor=3[67]`)
	if a, b := strip.ReplaceAllString(LDFlags("v1.37.2"), ""), strip.ReplaceAllString(LDFlags("v1.36.3"), ""); a != b {
		t.Errorf("the link flags differ beyond the version:\n%s\n%s", a, b)
	}
}

// Each older release has a module of its own that requires exactly that
// version of k8s.io/kubernetes and replaces every staging module with the
// same release, and the newest is test/cluster's own go.mod.
func TestReleaseModulesPinTheirVersion(t *testing.T) {
	for _, r := range Releases {
		data, err := os.ReadFile(filepath.Join(r.Module, "go.mod"))
		if err != nil {
			t.Fatal(err)
		}
		mod := string(data)
		if !regexp.MustCompile(`(?m)^\s*k8s\.io/kubernetes ` + regexp.QuoteMeta(r.Version) + `\b`).MatchString(mod) {
			t.Errorf("%s/go.mod does not require k8s.io/kubernetes %s", r.Module, r.Version)
		}
		staging := "v0." + strings.TrimPrefix(r.Version, "v1.")
		replaces := regexp.MustCompile(`(?m)^\s*(k8s\.io/[\w-]+) => k8s\.io/[\w-]+ (\S+)$`).FindAllStringSubmatch(mod, -1)
		if len(replaces) < 30 {
			t.Errorf("%s/go.mod replaces %d staging modules, want all of them", r.Module, len(replaces))
		}
		for _, m := range replaces {
			if m[2] != staging {
				t.Errorf("%s/go.mod: %s => %s, want %s", r.Module, m[1], m[2], staging)
			}
		}
		for _, b := range Binaries {
			if !strings.Contains(mod, "\t"+b.Package+"\n") {
				t.Errorf("%s/go.mod has no tool %s", r.Module, b.Package)
			}
		}
	}
}

// A set's stale binaries are built in one go build and installed under
// their own names (a package path ending in a major version, as etcd's
// does, included), each with its stamp; a second build finds them current
// and builds nothing; a changed go.mod makes them stale again.
func TestBuildSetBuildsStaleBinariesTogether(t *testing.T) {
	root := t.TempDir()
	mod := filepath.Join(root, "m")
	files := map[string]string{
		"go.mod":            "module example.com/tools\n\ngo 1.26\n",
		"go.sum":            "",
		"cmd/first/main.go": "package main\n\nfunc main() { println(\"first\") }\n",
		"server/v3/main.go": "package main\n\nfunc main() { println(\"etcd\") }\n",
	}
	for name, content := range files {
		p := filepath.Join(mod, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	set := toolset{name: "tools", version: "v1", subdir: "m", outDir: filepath.Join(root, "bin"), ldflags: "-s -w",
		binaries: []Binary{{"first", "example.com/tools/cmd/first"}, {"etcd", "example.com/tools/server/v3"}}}
	build := func() string {
		t.Helper()
		var progress strings.Builder
		if err := buildSet(t.Context(), BuildOptions{ModuleDir: root, Progress: &progress}, "go-test", set); err != nil {
			t.Fatal(err)
		}
		return progress.String()
	}
	if out := build(); !strings.Contains(out, "building first, etcd (2 of 2)... done") {
		t.Errorf("first build said %q, want both built in one go", out)
	}
	for _, b := range set.binaries {
		out, err := exec.Command(filepath.Join(set.outDir, b.Name)).CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != map[string]string{"first": "first", "etcd": "etcd"}[b.Name] {
			t.Errorf("%s: %q, %v", b.Name, out, err)
		}
	}
	if entries, _ := os.ReadDir(set.outDir); len(entries) != 4 {
		t.Errorf("%s holds %d entries, want the two binaries and their stamps", set.outDir, len(entries))
	}
	if out := build(); strings.Contains(out, "building") || strings.Count(out, "is current") != 2 {
		t.Errorf("second build said %q, want both current", out)
	}
	if err := os.WriteFile(filepath.Join(mod, "go.mod"), []byte(files["go.mod"]+"\n// changed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out := build(); !strings.Contains(out, "building first, etcd (2 of 2)") {
		t.Errorf("after go.mod changed the build said %q, want both built again", out)
	}
}
