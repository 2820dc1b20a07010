package kubeletplugin

import (
	"context"
	"net"
	"path/filepath"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2/ktesting"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// fakeDRA answers NodePrepareResources as the helper does for a request
// with no claims.
type fakeDRA struct {
	drapb.UnimplementedDRAPluginServer
}

func (fakeDRA) NodePrepareResources(context.Context, *drapb.NodePrepareResourcesRequest) (*drapb.NodePrepareResourcesResponse, error) {
	return &drapb.NodePrepareResourcesResponse{}, nil
}

func serveDRA(t *testing.T, socket string) {
	t.Helper()
	lis, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	drapb.RegisterDRAPluginServer(srv, fakeDRA{})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
}

func TestProbes(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	// Ask through a real client, as the kubelet's grpc probe does.
	p2 := &probeServer{}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, p2)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	client := healthpb.NewHealthClient(conn)
	check := func(service string) healthpb.HealthCheckResponse_ServingStatus {
		t.Helper()
		r, err := client.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
		if err != nil {
			t.Fatalf("Check(%q): %v", service, err)
		}
		return r.Status
	}
	notServing, serving := healthpb.HealthCheckResponse_NOT_SERVING, healthpb.HealthCheckResponse_SERVING

	if got := check(ProbeStartup); got != notServing {
		t.Errorf("before the helper runs: %v, want NOT_SERVING", got)
	}
	var reg *registerapi.RegistrationStatus
	socket := filepath.Join(t.TempDir(), DRASocket)
	p2.setHelper(func() *registerapi.RegistrationStatus { return reg }, socket)
	if got := check(ProbeStartup); got != notServing {
		t.Errorf("before the kubelet registered the plugin: %v, want NOT_SERVING", got)
	}
	reg = &registerapi.RegistrationStatus{PluginRegistered: false, Error: "version not supported"}
	if got := check(ProbeLiveness); got != notServing {
		t.Errorf("registration refused: %v, want NOT_SERVING", got)
	}
	reg = &registerapi.RegistrationStatus{PluginRegistered: true}
	if got := check(ProbeLiveness); got != notServing {
		t.Errorf("registered but no DRA socket: %v, want NOT_SERVING", got)
	}
	serveDRA(t, socket)
	for _, s := range []string{ProbeStartup, ProbeLiveness, ""} {
		if got := check(s); got != serving {
			t.Errorf("Check(%q) with the plugin registered and serving: %v, want SERVING", s, got)
		}
	}
	if _, err := client.Check(ctx, &healthpb.HealthCheckRequest{Service: "readiness"}); status.Code(err) != codes.NotFound {
		t.Errorf("unknown service: %v, want NotFound", err)
	}
}

func TestProbesNeedAFreeAddress(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lis.Close() }()
	if _, err := serveProbes(ctx, lis.Addr().String(), &probeServer{}); err == nil {
		t.Error("serving probes on a taken address succeeded")
	}
	stop, err := serveProbes(ctx, "", &probeServer{})
	if err != nil {
		t.Fatal(err)
	}
	stop()
}
