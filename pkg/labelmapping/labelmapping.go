// Package labelmapping keeps the cluster's node-label mapping: the
// ConfigMap gputopo-label-mapping, which says which node labels name a
// node's leaf, spine, core and NVLink clique. The kubelet plugins, the
// controller and the CLI all read that one ConfigMap, so they agree on
// where every node sits; a cluster without it uses the built-in defaults
// (topology.DefaultLabelMapping).
package labelmapping

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"strings"
	"sync"

	"github.com/spf13/pflag"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"

	"github.com/gputopo/gputopo/pkg/command"
	"github.com/gputopo/gputopo/pkg/topology"
)

// Options are the daemons' flags for the mapping.
type Options struct {
	// ConfigMap is NAMESPACE/NAME of the mapping ConfigMap.
	ConfigMap string
	// File, when set, is a ConfigMap manifest read instead of the cluster's.
	File string
}

// NewOptions points at gputopo-label-mapping in the daemon's own
// namespace.
func NewOptions() Options {
	return Options{ConfigMap: command.Namespace() + "/" + topology.LabelMappingConfigMap}
}

// AddFlags registers --label-mapping and --label-mapping-file.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.ConfigMap, "label-mapping", o.ConfigMap, "ConfigMap NAMESPACE/NAME that maps node labels to leaf, spine, core and NVLink clique; watched, and the built-in defaults while it does not exist.")
	fs.StringVar(&o.File, "label-mapping-file", o.File, "Read the label mapping from this file (a ConfigMap manifest) instead of the cluster.")
}

// Validate checks the flags and, for a file, its content.
func (o *Options) Validate() error {
	if o.File != "" {
		_, err := ReadFile(o.File)
		return err
	}
	_, _, err := splitRef(o.ConfigMap)
	return err
}

func splitRef(ref string) (namespace, name string, err error) {
	ns, n, ok := strings.Cut(ref, "/")
	if !ok || ns == "" || n == "" || strings.Contains(n, "/") {
		return "", "", fmt.Errorf("--label-mapping=%q: want NAMESPACE/NAME of a ConfigMap, e.g. kube-system/%s", ref, topology.LabelMappingConfigMap)
	}
	return ns, n, nil
}

// ReadFile reads a mapping from a ConfigMap manifest.
func ReadFile(path string) (topology.LabelMapping, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return topology.LabelMapping{}, fmt.Errorf("read label mapping file: %w", err)
	}
	var cm v1.ConfigMap
	if err := yaml.UnmarshalStrict(raw, &cm); err != nil {
		return topology.LabelMapping{}, fmt.Errorf("label mapping file %s: want a ConfigMap manifest: %w", path, err)
	}
	m, err := topology.ParseLabelMapping(cm.Data)
	if err != nil {
		return topology.LabelMapping{}, fmt.Errorf("label mapping file %s: %w", path, err)
	}
	return m, nil
}

// Mapping returns the mapping the options name without watching it: from
// the file, or from the cluster when client is not nil, else the defaults.
func (o *Options) Mapping(ctx context.Context, client kubernetes.Interface) (topology.LabelMapping, error) {
	if o.File != "" {
		return ReadFile(o.File)
	}
	if client == nil {
		return topology.DefaultLabelMapping(), nil
	}
	ns, name, err := splitRef(o.ConfigMap)
	if err != nil {
		return topology.LabelMapping{}, err
	}
	cm, err := client.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return topology.DefaultLabelMapping(), nil
	case err != nil:
		return topology.LabelMapping{}, fmt.Errorf("read label mapping ConfigMap %s/%s (may this ServiceAccount get configmaps there?): %w", ns, name, err)
	}
	return FromConfigMap(cm)
}

// FromConfigMap parses a mapping ConfigMap.
func FromConfigMap(cm *v1.ConfigMap) (topology.LabelMapping, error) {
	m, err := topology.ParseLabelMapping(cm.Data)
	if err != nil {
		return topology.LabelMapping{}, fmt.Errorf("ConfigMap %s/%s: %w", cm.Namespace, cm.Name, err)
	}
	return m, nil
}

// Watcher holds the current mapping and tells its subscribers when the
// ConfigMap changes. A ConfigMap edited into something invalid is logged
// and ignored: the last good mapping stays.
type Watcher struct {
	mu      sync.Mutex
	current topology.LabelMapping
	subs    []func(topology.LabelMapping)
}

// Start reads the mapping and, unless it comes from a file, watches the
// ConfigMap until ctx is done. An unreadable or invalid mapping at start is
// an error, so a daemon never runs with a mapping it was not given.
func (o *Options) Start(ctx context.Context, client kubernetes.Interface) (*Watcher, error) {
	m, err := o.Mapping(ctx, client)
	if err != nil {
		return nil, err
	}
	w := &Watcher{current: m}
	if o.File != "" {
		return w, nil
	}
	ns, name, _ := splitRef(o.ConfigMap)
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(ns),
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
			lo.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
		}))
	logger := klog.FromContext(ctx).WithValues("configMap", ns+"/"+name)
	update := func(obj any) {
		cm, ok := obj.(*v1.ConfigMap)
		if !ok {
			return
		}
		m, err := FromConfigMap(cm)
		if err != nil {
			logger.Error(err, "Ignoring invalid label mapping; keeping the previous one")
			return
		}
		w.set(logger, m)
	}
	_, err = factory.Core().V1().ConfigMaps().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    update,
		UpdateFunc: func(_, obj any) { update(obj) },
		DeleteFunc: func(any) { w.set(logger, topology.DefaultLabelMapping()) },
	})
	if err != nil {
		return nil, fmt.Errorf("watch label mapping ConfigMap %s: %w", o.ConfigMap, err)
	}
	factory.Start(ctx.Done())
	go func() {
		<-ctx.Done()
		factory.Shutdown()
	}()
	logger.Info("Label mapping", "leaf", m.Leaf, "spine", m.Spine, "core", m.Core, "clique", m.Clique, "tierPrefix", m.TierPrefix)
	return w, nil
}

// Static is a watcher of a fixed mapping.
func Static(m topology.LabelMapping) *Watcher { return &Watcher{current: m} }

// Mapping is the current mapping.
func (w *Watcher) Mapping() topology.LabelMapping {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.current
}

// OnChange calls f with the current mapping now and with every new one.
func (w *Watcher) OnChange(f func(topology.LabelMapping)) {
	w.mu.Lock()
	w.subs = append(w.subs, f)
	m := w.current
	w.mu.Unlock()
	f(m)
}

func (w *Watcher) set(logger klog.Logger, m topology.LabelMapping) {
	w.mu.Lock()
	if maps.Equal(w.current.Data(), m.Data()) {
		w.mu.Unlock()
		return
	}
	w.current = m
	subs := append([]func(topology.LabelMapping){}, w.subs...)
	w.mu.Unlock()
	logger.Info("Label mapping changed", "leaf", m.Leaf, "spine", m.Spine, "core", m.Core, "clique", m.Clique, "tierPrefix", m.TierPrefix)
	for _, f := range subs {
		f(m)
	}
}

// DefaultsSource is Find's source when the cluster has no mapping.
const DefaultsSource = "built-in defaults"

// ErrAmbiguous is returned by Find when several namespaces hold a mapping.
var ErrAmbiguous = errors.New("several label mapping ConfigMaps")

// Find locates the cluster's mapping for the CLI, which does not know the
// namespace gputopo runs in: it lists ConfigMaps named
// gputopo-label-mapping in every namespace. It returns the mapping and
// where it came from ("NAMESPACE/NAME", or "built-in defaults" when there
// is none). ref, when not empty, names the ConfigMap instead.
func Find(ctx context.Context, client kubernetes.Interface, ref string) (topology.LabelMapping, string, error) {
	if ref != "" {
		o := Options{ConfigMap: ref}
		if err := o.Validate(); err != nil {
			return topology.LabelMapping{}, "", err
		}
		ns, name, _ := splitRef(ref)
		cm, err := client.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return topology.LabelMapping{}, "", fmt.Errorf("read label mapping ConfigMap %s: %w", ref, err)
		}
		m, err := FromConfigMap(cm)
		return m, ref, err
	}
	list, err := client.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("metadata.name", topology.LabelMappingConfigMap).String(),
	})
	if err != nil {
		return topology.LabelMapping{}, "", fmt.Errorf("look for the label mapping ConfigMap %s in every namespace (pass --label-mapping=NAMESPACE/NAME if you may not list ConfigMaps cluster-wide): %w",
			topology.LabelMappingConfigMap, err)
	}
	var found []*v1.ConfigMap
	for i := range list.Items {
		if list.Items[i].Name == topology.LabelMappingConfigMap {
			found = append(found, &list.Items[i])
		}
	}
	switch len(found) {
	case 0:
		return topology.DefaultLabelMapping(), DefaultsSource, nil
	case 1:
		m, err := FromConfigMap(found[0])
		return m, found[0].Namespace + "/" + found[0].Name, err
	}
	var where []string
	for _, cm := range found {
		where = append(where, cm.Namespace+"/"+cm.Name)
	}
	return topology.LabelMapping{}, "", fmt.Errorf("%w: %s; pass --label-mapping=NAMESPACE/NAME with the one gputopo uses", ErrAmbiguous, strings.Join(where, ", "))
}
