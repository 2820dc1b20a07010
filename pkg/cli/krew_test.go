package cli_test

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"

	"github.com/gputopo/gputopo/pkg/cli"
)

// krewPlugin is the part of krew's Plugin manifest that installs a binary.
type krewPlugin struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		Version          string `json:"version"`
		Homepage         string `json:"homepage"`
		ShortDescription string `json:"shortDescription"`
		Description      string `json:"description"`
		Caveats          string `json:"caveats"`
		Platforms        []struct {
			Selector struct {
				MatchLabels map[string]string `json:"matchLabels"`
			} `json:"selector"`
			URI    string `json:"uri"`
			SHA256 string `json:"sha256"`
			Files  []struct {
				From string `json:"from"`
				To   string `json:"to"`
			} `json:"files"`
			Bin string `json:"bin"`
		} `json:"platforms"`
	} `json:"spec"`
}

// The krew manifest template installs kubectl-gputopo on every platform,
// and is a valid manifest once a release fills in its placeholders.
func TestKrewManifest(t *testing.T) {
	tmpl, err := os.ReadFile("../../deployments/krew/gputopo.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var raw krewPlugin
	if err := yaml.UnmarshalStrict(tmpl, &raw); err != nil {
		t.Fatalf("the template is not YAML of a krew Plugin manifest: %v", err)
	}
	for _, pl := range raw.Spec.Platforms {
		if pl.Bin != cli.PluginName {
			t.Errorf("template: bin %q, want %s", pl.Bin, cli.PluginName)
		}
	}
	sha := strings.Repeat("0123456789abcdef", 4)
	rendered := regexp.MustCompile(`\$\{SHA256_[A-Z0-9]+_[A-Z0-9]+\}`).ReplaceAllString(strings.ReplaceAll(string(tmpl), "${VERSION}", "v1.2.3"), sha)
	if strings.Contains(rendered, "${") {
		t.Errorf("placeholders other than ${VERSION} and ${SHA256_OS_ARCH} are left:\n%s", rendered)
	}
	var p krewPlugin
	if err := yaml.UnmarshalStrict([]byte(rendered), &p); err != nil {
		t.Fatalf("not a krew Plugin manifest: %v", err)
	}
	type platform struct {
		OS, Arch, URI, SHA256, Bin string
		Files                      []string
	}
	var got []platform
	for _, pl := range p.Spec.Platforms {
		g := platform{OS: pl.Selector.MatchLabels["os"], Arch: pl.Selector.MatchLabels["arch"], URI: pl.URI, SHA256: pl.SHA256, Bin: pl.Bin}
		for _, f := range pl.Files {
			g.Files = append(g.Files, f.From+"->"+f.To)
		}
		got = append(got, g)
	}
	var want []platform
	for _, osArch := range [][2]string{{"linux", "amd64"}, {"linux", "arm64"}, {"darwin", "amd64"}, {"darwin", "arm64"}} {
		want = append(want, platform{
			OS: osArch[0], Arch: osArch[1],
			URI:    fmt.Sprintf("https://github.com/gputopo/gputopo/releases/download/v1.2.3/gputopo_v1.2.3_%s_%s.tar.gz", osArch[0], osArch[1]),
			SHA256: sha,
			Bin:    cli.PluginName,
			Files:  []string{cli.PluginName + "->.", cli.PluginCompletionName + "->.", "LICENSE->."},
		})
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("platforms (-want +got):\n%s", diff)
	}
	head := []string{p.APIVersion, p.Kind, p.Metadata.Name, p.Spec.Version}
	if diff := cmp.Diff([]string{"krew.googlecontainertools.github.com/v1alpha2", "Plugin", cli.CommandName, "v1.2.3"}, head); diff != "" {
		t.Errorf("apiVersion, kind, name, version (-want +got):\n%s", diff)
	}
	if p.Spec.ShortDescription == "" || p.Spec.Homepage == "" || !strings.Contains(p.Spec.Caveats, cli.PluginCompletionName) {
		t.Errorf("shortDescription %q, homepage %q, caveats %q: want all, the caveats naming %s", p.Spec.ShortDescription, p.Spec.Homepage, p.Spec.Caveats, cli.PluginCompletionName)
	}
}
