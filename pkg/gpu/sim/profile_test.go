package sim_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/gputopo/gputopo/pkg/gpu"
	"github.com/gputopo/gputopo/pkg/gpu/sim"
)

func TestBuiltinProfilesLoad(t *testing.T) {
	want := []string{"dgx-h100", "dgx1-v100", "gb200-nvl72-tray", "hgx-pcie-pairs", "pcie-only"}
	if diff := cmp.Diff(want, sim.Builtin()); diff != "" {
		t.Fatalf("builtin profiles (-want +got):\n%s", diff)
	}
	for _, name := range want {
		p, err := sim.LoadBuiltin(name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		inv := p.Inventory("n")
		seen := map[string]bool{}
		for _, d := range inv.Devices {
			if seen[d.UUID] || seen[d.PCIBusID] {
				t.Errorf("%s: duplicate UUID or bus ID for GPU %d", name, d.Index)
			}
			seen[d.UUID], seen[d.PCIBusID] = true, true
		}
	}
}

func TestUnknownProfile(t *testing.T) {
	_, err := sim.LoadBuiltin("dgx-a100")
	if !errors.Is(err, sim.ErrUnknownProfile) || !strings.Contains(err.Error(), "dgx-h100") {
		t.Errorf("want ErrUnknownProfile listing the choices, got %v", err)
	}
}

func TestParseProfileErrors(t *testing.T) {
	base := `name: x
productName: P
architecture: hopper
cudaComputeCapability: "9.0"
driverVersion: "550.54.15"
cudaDriverVersion: "12.4"
memory: 80Gi
gpus: 2
numaNodes: 1
pcieRoots: 1
`
	tests := map[string]struct{ yaml, want string }{
		"ok":            {base + "nvlink: [[0, 2], [2, 0]]\n", ""},
		"asymmetric":    {base + "nvlink: [[0, 2], [1, 0]]\n", "not symmetric"},
		"self link":     {base + "nvlink: [[1, 2], [2, 0]]\n", "no link to itself"},
		"short matrix":  {base + "nvlink: [[0, 2]]\n", "must have 2 rows"},
		"unknown field": {base + "nvlinks: []\n", "unknown field"},
		"bad memory":    {strings.Replace(base, "80Gi", "lots", 1), "memory must be"},
		"bad version":   {strings.Replace(base, `"550.54.15"`, `"r550"`, 1), "driverVersion"},
		"too many numa": {strings.Replace(base, "numaNodes: 1", "numaNodes: 3", 1), "numaNodes"},
		"empty":         {"", "empty"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := sim.ParseProfile([]byte(tc.yaml))
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("unexpected error: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("want error containing %q, got %v", tc.want, err)
			}
		})
	}
}

func TestUUIDsDifferPerNode(t *testing.T) {
	p, _ := sim.LoadBuiltin("dgx-h100")
	if p.Inventory("a").Devices[0].UUID == p.Inventory("b").Devices[0].UUID {
		t.Error("two nodes share a GPU UUID")
	}
	if p.Inventory("a").Devices[0].UUID != p.Inventory("a").Devices[0].UUID {
		t.Error("UUIDs must be stable across restarts")
	}
}

func TestHealthFileFaults(t *testing.T) {
	p, _ := sim.LoadBuiltin("pcie-only")
	file := filepath.Join(t.TempDir(), "unhealthy")
	b := sim.New(p, "n", sim.WithHealthFile(file), sim.WithPollInterval(10*time.Millisecond))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events := make(chan gpu.HealthEvent)
	done := make(chan error)
	go func() { done <- b.WatchHealth(ctx, events) }()
	if ev := <-events; ev.Watch != gpu.WatchActive {
		t.Errorf("first event %+v, want the watch Active", ev)
	}

	if err := os.WriteFile(file, []byte("# comment\n2 XID-79\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ev := <-events
	inv, _ := b.Discover(ctx)
	if ev.UUID != inv.Devices[2].UUID || ev.Healthy || ev.Reason != "XID-79" {
		t.Errorf("fault event = %+v", ev)
	}
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if ev := <-events; !ev.Healthy || ev.UUID != inv.Devices[2].UUID {
		t.Errorf("recovery event = %+v", ev)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("WatchHealth returned %v", err)
	}
}

func FuzzParseProfile(f *testing.F) {
	for _, name := range sim.Builtin() {
		data, err := os.ReadFile(filepath.Join("profiles", name+".yaml"))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := sim.ParseProfile(data)
		if err != nil {
			return
		}
		// Anything accepted must yield a consistent inventory.
		inv := p.Inventory("fuzz")
		if len(inv.Devices) != p.GPUs {
			t.Fatalf("inventory has %d GPUs, profile %d", len(inv.Devices), p.GPUs)
		}
		for _, l := range inv.Links {
			if l.A >= l.B || l.B >= p.GPUs || l.Count <= 0 {
				t.Fatalf("bad link %+v", l)
			}
		}
	})
}
