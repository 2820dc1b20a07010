// Command chartcheck checks Kubernetes manifests rendered by `helm template`
// without a cluster: every document must decode strictly (no unknown or
// duplicate fields) into the Kubernetes 1.37 Go types of the kinds it names,
// carry a valid name (and a namespace when namespaced), and appear once.
// Kinds outside client-go's scheme (ServiceMonitor) are only checked for
// apiVersion, kind and name, and must be listed in allowedForeign.
//
//	helm template ... | go run ./hack/chartcheck [-expect Kind=N,...] [FILE...]
package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/validation"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"
)

// allowedForeign are kinds that are not in client-go's scheme.
var allowedForeign = map[schema.GroupVersionKind]bool{
	{Group: "monitoring.coreos.com", Version: "v1", Kind: "ServiceMonitor"}: true,
}

// clusterScoped are the cluster-scoped kinds the chart may render.
var clusterScoped = map[string]bool{
	"ClusterRole": true, "ClusterRoleBinding": true, "DeviceClass": true, "Namespace": true,
	"ValidatingAdmissionPolicy": true, "ValidatingAdmissionPolicyBinding": true,
	"MutatingAdmissionPolicy": true, "MutatingAdmissionPolicyBinding": true,
	"PriorityClass": true, "RuntimeClass": true,
}

func main() {
	expect := flag.String("expect", "", "comma-separated Kind=N: fail unless exactly N objects of each listed kind were rendered")
	flag.Parse()
	var inputs []io.Reader
	names := flag.Args()
	if len(names) == 0 {
		inputs, names = []io.Reader{os.Stdin}, []string{"<stdin>"}
	} else {
		for _, n := range names {
			f, err := os.Open(n)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(2)
			}
			defer f.Close()
			inputs = append(inputs, f)
		}
	}
	counts, err := check(inputs, names)
	if err == nil && *expect != "" {
		err = checkExpect(*expect, counts)
	}
	kinds := make([]string, 0, len(counts))
	total := 0
	for k, n := range counts {
		kinds = append(kinds, fmt.Sprintf("%s=%d", k, n))
		total += n
	}
	sort.Strings(kinds)
	if err != nil {
		fmt.Fprintf(os.Stderr, "chartcheck: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("chartcheck: %d objects OK: %s\n", total, strings.Join(kinds, " "))
}

func check(inputs []io.Reader, names []string) (map[string]int, error) {
	decoder := serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()
	counts := map[string]int{}
	seen := map[string]bool{}
	var errs []error
	for i, in := range inputs {
		r := utilyaml.NewYAMLReader(bufio.NewReader(in))
		for doc := 1; ; doc++ {
			raw, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return counts, fmt.Errorf("%s: document %d: %w", names[i], doc, err)
			}
			if len(bytes.TrimSpace(stripComments(raw))) == 0 {
				continue
			}
			kind, id, err := checkDoc(decoder, raw)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: document %d (%s): %w", names[i], doc, id, err))
				continue
			}
			if seen[id] {
				errs = append(errs, fmt.Errorf("%s: %s rendered twice", names[i], id))
			}
			seen[id] = true
			counts[kind]++
		}
	}
	return counts, errors.Join(errs...)
}

func checkDoc(decoder runtime.Decoder, raw []byte) (kind, id string, err error) {
	js, err := yaml.YAMLToJSONStrict(raw)
	if err != nil {
		return "", "?", fmt.Errorf("YAML: %w", err)
	}
	var meta struct {
		metav1.TypeMeta `json:",inline"`
		Metadata        metav1.ObjectMeta `json:"metadata"`
	}
	if err := yaml.Unmarshal(js, &meta); err != nil {
		return "", "?", err
	}
	gvk := meta.GroupVersionKind()
	id = fmt.Sprintf("%s %s/%s", meta.Kind, meta.Metadata.Namespace, meta.Metadata.Name)
	if gvk.Kind == "" || gvk.Version == "" {
		return "", id, errors.New("apiVersion and kind are required")
	}
	if scheme.Scheme.Recognizes(gvk) {
		if _, _, err := decoder.Decode(js, nil, nil); err != nil {
			return "", id, err
		}
	} else if !allowedForeign[gvk] {
		return "", id, fmt.Errorf("%s is not a Kubernetes 1.37 kind known to client-go", gvk)
	}
	if msgs := validation.IsDNS1123Subdomain(meta.Metadata.Name); len(msgs) > 0 {
		return "", id, fmt.Errorf("metadata.name %q: %s", meta.Metadata.Name, strings.Join(msgs, "; "))
	}
	if ns := meta.Metadata.Namespace; clusterScoped[gvk.Kind] != (ns == "") {
		return "", id, fmt.Errorf("namespace %q on a %s (cluster-scoped: %v)", ns, gvk.Kind, clusterScoped[gvk.Kind])
	}
	for k, v := range meta.Metadata.Labels {
		if msgs := append(validation.IsQualifiedName(k), validation.IsValidLabelValue(v)...); len(msgs) > 0 {
			return "", id, fmt.Errorf("label %s=%s: %s", k, v, strings.Join(msgs, "; "))
		}
	}
	return gvk.Kind, id, nil
}

func checkExpect(spec string, counts map[string]int) error {
	var errs []error
	for _, kv := range strings.Split(spec, ",") {
		k, v, ok := strings.Cut(kv, "=")
		n, err := strconv.Atoi(v)
		if !ok || err != nil {
			return fmt.Errorf("-expect %q: want Kind=N", kv)
		}
		if counts[k] != n {
			errs = append(errs, fmt.Errorf("want %d %s, rendered %d", n, k, counts[k]))
		}
	}
	return errors.Join(errs...)
}

// stripComments drops comment-only lines, so a document made of comments
// counts as empty.
func stripComments(b []byte) []byte {
	var out [][]byte
	for _, l := range bytes.Split(b, []byte("\n")) {
		if t := bytes.TrimSpace(l); len(t) > 0 && t[0] != '#' {
			out = append(out, l)
		}
	}
	return bytes.Join(out, []byte("\n"))
}
