package scale

import (
	"maps"
	"strings"
	"testing"
)

func TestParseCPURequests(t *testing.T) {
	got, err := ParseCPURequests("kubeadm, controller=250m, kube-scheduler=1")
	if err != nil {
		t.Fatal(err)
	}
	want := maps.Clone(KubeadmCPURequests)
	want["controller"], want["kube-scheduler"] = 250, 1000
	if !maps.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	if got, err := ParseCPURequests(""); err != nil || len(got) != 0 {
		t.Errorf("empty: got %v, %v; want nothing weighed", got, err)
	}
	for in, why := range map[string]string{
		"kubelet=100m":    "NAME one of",
		"controller":      "NAME=QUANTITY",
		"controller=fast": "not a positive CPU quantity",
		"controller=0":    "not a positive CPU quantity",
	} {
		if _, err := ParseCPURequests(in); err == nil || !strings.Contains(err.Error(), why) {
			t.Errorf("%q: got %v, want an error saying %q", in, err, why)
		}
	}
}
