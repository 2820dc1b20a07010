package labelmapping_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"

	"github.com/gputopo/gputopo/pkg/labelmapping"
	"github.com/gputopo/gputopo/pkg/topology"
)

func configMap(ns, name string, data map[string]string) *v1.ConfigMap {
	return &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: data}
}

func mustParse(t *testing.T, data map[string]string) topology.LabelMapping {
	t.Helper()
	m, err := topology.ParseLabelMapping(data)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestFind(t *testing.T) {
	rack := map[string]string{"leaf": "example.com/rack"}
	for name, tc := range map[string]struct {
		objs       []*v1.ConfigMap
		ref        string
		want       topology.LabelMapping
		wantSource string
		wantErr    error
	}{
		"none: the defaults": {
			objs: []*v1.ConfigMap{configMap("gputopo", "other", rack)},
			want: topology.DefaultLabelMapping(), wantSource: labelmapping.DefaultsSource,
		},
		"one, in any namespace": {
			objs: []*v1.ConfigMap{configMap("gputopo", topology.LabelMappingConfigMap, rack)},
			want: mustParse(t, rack), wantSource: "gputopo/" + topology.LabelMappingConfigMap,
		},
		"two: ambiguous": {
			objs:    []*v1.ConfigMap{configMap("a", topology.LabelMappingConfigMap, nil), configMap("b", topology.LabelMappingConfigMap, rack)},
			wantErr: labelmapping.ErrAmbiguous,
		},
		"named": {
			objs: []*v1.ConfigMap{configMap("a", topology.LabelMappingConfigMap, nil), configMap("b", topology.LabelMappingConfigMap, rack)},
			ref:  "b/" + topology.LabelMappingConfigMap,
			want: mustParse(t, rack), wantSource: "b/" + topology.LabelMappingConfigMap,
		},
	} {
		t.Run(name, func(t *testing.T) {
			client := fake.NewClientset()
			for _, cm := range tc.objs {
				if _, err := client.CoreV1().ConfigMaps(cm.Namespace).Create(context.Background(), cm, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			got, source, err := labelmapping.Find(context.Background(), client, tc.ref)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if err != nil {
				return
			}
			if diff := cmp.Diff(tc.want, got); diff != "" || source != tc.wantSource {
				t.Errorf("source %q, want %q; mapping (-want +got):\n%s", source, tc.wantSource, diff)
			}
		})
	}
}

func TestOptionsValidate(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(good, []byte("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: m}\ndata: {leaf: example.com/rack}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte("apiVersion: v1\nkind: ConfigMap\ndata: {leafs: example.com/rack}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		o    labelmapping.Options
		want string
	}{
		"default":      {o: labelmapping.NewOptions()},
		"no namespace": {o: labelmapping.Options{ConfigMap: "gputopo-label-mapping"}, want: "want NAMESPACE/NAME"},
		"file":         {o: labelmapping.Options{File: good}},
		"bad file":     {o: labelmapping.Options{File: bad}, want: `unknown key "leafs"`},
		"missing file": {o: labelmapping.Options{File: filepath.Join(dir, "nope")}, want: "read label mapping file"},
	} {
		t.Run(name, func(t *testing.T) {
			err := tc.o.Validate()
			if (err == nil) != (tc.want == "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("Validate() = %v, want an error saying %q", err, tc.want)
			}
		})
	}
	m, err := labelmapping.ReadFile(good)
	if err != nil || m.Leaf[0] != "example.com/rack" || m.Spine[0] != topology.LabelTopographSpine {
		t.Errorf("ReadFile = %+v, %v", m, err)
	}
}

// The watcher follows the ConfigMap: created, edited, broken (ignored),
// deleted (the defaults again).
func TestWatcherFollowsConfigMap(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	client := fake.NewClientset()
	o := labelmapping.Options{ConfigMap: "gputopo/" + topology.LabelMappingConfigMap}
	w, err := o.Start(ctx, client)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []string // leaf labels of every mapping delivered
	w.OnChange(func(m topology.LabelMapping) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, strings.Join(m.Leaf, ","))
	})
	wait := func(want ...string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			mu.Lock()
			got := append([]string{}, seen...)
			mu.Unlock()
			if cmp.Equal(want, got) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("mappings delivered (-want +got):\n%s", cmp.Diff(want, got))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	def := strings.Join(topology.DefaultLabelMapping().Leaf, ",")
	wait(def)

	cms := client.CoreV1().ConfigMaps("gputopo")
	cm := configMap("gputopo", topology.LabelMappingConfigMap, map[string]string{"leaf": "example.com/rack"})
	if _, err := cms.Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait(def, "example.com/rack")
	cm.Data = map[string]string{"leaf": "not a label"}
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	cm.Data = map[string]string{"leaf": "example.com/rack2"}
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait(def, "example.com/rack", "example.com/rack2")
	if got := w.Mapping().Leaf; !cmp.Equal(got, []string{"example.com/rack2"}) {
		t.Errorf("Mapping().Leaf = %v", got)
	}
	if err := cms.Delete(ctx, cm.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	wait(def, "example.com/rack", "example.com/rack2", def)
}

func TestStartRefusesInvalidMapping(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	client := fake.NewClientset(configMap("kube-system", topology.LabelMappingConfigMap, map[string]string{"spine": "a b"}))
	o := labelmapping.Options{ConfigMap: "kube-system/" + topology.LabelMappingConfigMap}
	if _, err := o.Start(ctx, client); err == nil || !strings.Contains(err.Error(), `spine label "a b"`) {
		t.Errorf("Start = %v, want the invalid spine label named", err)
	}
}
