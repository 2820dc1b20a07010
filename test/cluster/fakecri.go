package cluster

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"
	criutil "k8s.io/cri-client/pkg/util"
)

// cdiAnnotationPrefix is how runtimes used to receive CDI devices before the
// CDIDevices field; recorded too, in case a kubelet still sends them.
const cdiAnnotationPrefix = "cdi.k8s.io/"

// Record is what a container would have received from the kubelet: one
// CreateContainer request seen by the fake CRI.
type Record struct {
	Time         time.Time `json:"time"`
	PodName      string    `json:"podName"`
	PodNamespace string    `json:"podNamespace"`
	PodUID       string    `json:"podUID"`
	Container    string    `json:"container"`
	// CDIDevices are the fully qualified CDI device names of the request's
	// CDIDevices field, in order.
	CDIDevices []string `json:"cdiDevices,omitempty"`
	// CDIAnnotations are the request's cdi.k8s.io/* annotations.
	CDIAnnotations map[string]string `json:"cdiAnnotations,omitempty"`
	// Env is the container's environment.
	Env map[string]string `json:"env,omitempty"`
}

// FakeCRI is a fake container runtime on a unix socket that records every
// CreateContainer request.
type FakeCRI struct {
	runtime *recordingRuntime
	server  *grpc.Server
	stop    chan struct{}
}

// StartFakeCRI serves k8s.io/cri-client's fake runtime on socket and appends
// a Record per CreateContainer request as a JSON line to recordFile.
func StartFakeCRI(socket, recordFile string) (*FakeCRI, error) {
	rec, err := os.OpenFile(recordFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open fake CRI record file: %w", err)
	}
	rt := &recordingRuntime{RemoteRuntime: fake.NewFakeRemoteRuntime(), record: rec}
	// The kubelet rejects images of size 0.
	rt.ImageService.SetFakeImageSize(4 << 20)
	rt.RuntimeService.FakeStatus = &runtimeapi.RuntimeStatus{Conditions: []*runtimeapi.RuntimeCondition{
		{Type: runtimeapi.RuntimeReady, Status: true},
		{Type: runtimeapi.NetworkReady, Status: true},
	}}
	l, err := criutil.CreateListener("unix://" + socket)
	if err != nil {
		rec.Close()
		return nil, fmt.Errorf("listen for fake CRI on %s: %w", socket, err)
	}
	f := &FakeCRI{runtime: rt, server: grpc.NewServer(), stop: make(chan struct{})}
	runtimeapi.RegisterRuntimeServiceServer(f.server, rt)
	runtimeapi.RegisterImageServiceServer(f.server, rt)
	go f.server.Serve(l)
	go f.trimCallLog()
	return f, nil
}

// Stop stops serving and closes the record file.
func (f *FakeCRI) Stop() {
	select {
	case <-f.stop:
		return
	default:
	}
	close(f.stop)
	f.server.Stop()
	f.runtime.mu.Lock()
	f.runtime.record.Close()
	f.runtime.mu.Unlock()
}

// trimCallLog empties the fake's list of calls now and then: it only grows,
// and the kubelet polls the runtime several times a second.
func (f *FakeCRI) trimCallLog() {
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	for {
		select {
		case <-f.stop:
			return
		case <-t.C:
		}
		rs, is := f.runtime.RuntimeService, f.runtime.ImageService
		rs.Lock()
		rs.Called = rs.Called[:0]
		rs.Unlock()
		is.Lock()
		is.Called = is.Called[:0]
		is.Unlock()
	}
}

type recordingRuntime struct {
	*fake.RemoteRuntime
	mu     sync.Mutex
	record *os.File
}

func (r *recordingRuntime) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	resp, err := r.RemoteRuntime.CreateContainer(ctx, req)
	if err != nil {
		return nil, err
	}
	// An empty log path makes the kubelet's log cleanup glob "*" in its
	// working directory; give it one that never exists.
	rs := r.RuntimeService
	rs.Lock()
	if c := rs.Containers[resp.ContainerId]; c != nil {
		c.LogPath = filepath.Join("/nonexistent/gputopo-fakecri", resp.ContainerId+".log")
	}
	rs.Unlock()
	if err := r.write(recordOf(req)); err != nil {
		return nil, fmt.Errorf("record CreateContainer: %w", err)
	}
	return resp, nil
}

func recordOf(req *runtimeapi.CreateContainerRequest) Record {
	rec := Record{Time: time.Now().UTC()}
	if md := req.GetSandboxConfig().GetMetadata(); md != nil {
		rec.PodName, rec.PodNamespace, rec.PodUID = md.Name, md.Namespace, md.Uid
	}
	cfg := req.GetConfig()
	rec.Container = cfg.GetMetadata().GetName()
	for _, d := range cfg.GetCDIDevices() {
		rec.CDIDevices = append(rec.CDIDevices, d.GetName())
	}
	for k, v := range cfg.GetAnnotations() {
		if strings.HasPrefix(k, cdiAnnotationPrefix) {
			if rec.CDIAnnotations == nil {
				rec.CDIAnnotations = map[string]string{}
			}
			rec.CDIAnnotations[k] = v
		}
	}
	for _, e := range cfg.GetEnvs() {
		if rec.Env == nil {
			rec.Env = map[string]string{}
		}
		rec.Env[e.GetKey()] = string(e.GetValue())
	}
	return rec
}

func (r *recordingRuntime) write(rec Record) error {
	line, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	_, err = r.record.Write(append(line, '\n'))
	return err
}

// ReadRecords reads a fake CRI record file. A missing file has no records.
func ReadRecords(path string) ([]Record, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open container records: %w", err)
	}
	defer f.Close()
	var recs []Record
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for sc.Scan() {
		if len(strings.TrimSpace(sc.Text())) == 0 {
			continue
		}
		var rec Record
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			return nil, fmt.Errorf("decode container record in %s: %w", path, err)
		}
		recs = append(recs, rec)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read container records %s: %w", path, err)
	}
	sort.SliceStable(recs, func(i, j int) bool { return recs[i].Time.Before(recs[j].Time) })
	return recs, nil
}
