package command

import (
	"context"
	"errors"
	"os"
	"regexp"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/version"
	fakediscovery "k8s.io/client-go/discovery/fake"
	"k8s.io/client-go/kubernetes/fake"
	"sigs.k8s.io/yaml"
)

func TestSupportedVersion(t *testing.T) {
	for _, tc := range []struct {
		version string
		wantErr string // "" for supported
	}{
		{"v1.37.2", ""},
		{"v1.36.3", ""},
		{"v1.36.0", ""},
		{"v1.36.3-eks-4096722", ""},
		{"v1.36.1+k3s1", ""},
		{"v1.37.0-rc.1", ""},
		{"v1.38.0-alpha.0", ""},
		{"v2.0.0", ""},
		{"v1.35.4", "the cluster runs Kubernetes v1.35.4, which gputopo does not support: it needs 1.36 or newer"},
		{"v1.34.3-gke.1", "Kubernetes v1.34.3-gke.1, which gputopo does not support: it needs 1.36 or newer"},
		{"v1.9.0", "Kubernetes v1.9.0, which"},
		{"v0.40.0", "Kubernetes v0.40.0, which"},
		{"banana", `reports Kubernetes version "banana", which is not a version gputopo can read; gputopo needs 1.36 or newer`},
	} {
		err := SupportedVersion(tc.version)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("SupportedVersion(%q) = %v, want nil", tc.version, err)
		case tc.wantErr != "" && err == nil:
			t.Errorf("SupportedVersion(%q) = nil, want an error containing %q", tc.version, tc.wantErr)
		case tc.wantErr != "" && !strings.Contains(err.Error(), tc.wantErr):
			t.Errorf("SupportedVersion(%q) = %q, want it to contain %q", tc.version, err, tc.wantErr)
		case err != nil && strings.Contains(err.Error(), "\n"):
			t.Errorf("SupportedVersion(%q) = %q: want one line", tc.version, err)
		}
	}
}

// CheckServerVersion reads the version through discovery, as the daemons
// do at start.
func TestCheckServerVersion(t *testing.T) {
	for _, tc := range []struct {
		info    *version.Info
		wantErr string
	}{
		{&version.Info{Major: "1", Minor: "37", GitVersion: "v1.37.2"}, ""},
		{&version.Info{Major: "1", Minor: "36", GitVersion: "v1.36.3"}, ""},
		{&version.Info{Major: "1", Minor: "35", GitVersion: "v1.35.4"}, "Kubernetes v1.35.4, which gputopo does not support: it needs 1.36 or newer"},
		// No gitVersion: major and minor are read instead.
		{&version.Info{Major: "1", Minor: "35"}, "Kubernetes v1.35, which"},
	} {
		client := fake.NewClientset()
		client.Discovery().(*fakediscovery.FakeDiscovery).FakedServerVersion = tc.info
		err := CheckServerVersion(context.Background(), client.Discovery())
		if tc.wantErr == "" {
			if err != nil {
				t.Errorf("%s: %v, want nil", tc.info.GitVersion, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%+v: %v, want an error containing %q", tc.info, err, tc.wantErr)
		}
	}
}

type failingDiscovery struct{ calls int }

func (f *failingDiscovery) ServerVersion() (*version.Info, error) {
	f.calls++
	return nil, errors.New("connection refused")
}

// An API server that never answers is an error naming why, once the
// context ends, not a hang.
func TestCheckServerVersionUnreachable(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	d := &failingDiscovery{}
	err := CheckServerVersion(ctx, d)
	if err == nil || !strings.Contains(err.Error(), "ask the API server for its Kubernetes version") {
		t.Fatalf("CheckServerVersion = %v, want an error saying the version could not be read", err)
	}
}

// The chart's kubeVersion admits exactly the releases the daemons accept:
// from MinKubernetesVersion on, pre-releases included.
func TestChartKubeVersionMatchesMinimum(t *testing.T) {
	data, err := os.ReadFile("../../deployments/helm/gputopo/Chart.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var chart struct {
		KubeVersion string `json:"kubeVersion"`
	}
	if err := yaml.Unmarshal(data, &chart); err != nil {
		t.Fatal(err)
	}
	if want := ">=" + MinKubernetesVersion + ".0-0"; chart.KubeVersion != want {
		t.Errorf("Chart.yaml kubeVersion = %q, want %q (MinKubernetesVersion)", chart.KubeVersion, want)
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`Kubernetes ` + regexp.QuoteMeta(MinKubernetesVersion) + ` or newer`).Match(readme) {
		t.Errorf("README.md does not say %q", "Kubernetes "+MinKubernetesVersion+" or newer")
	}
}
