package cli

import (
	"fmt"
	"io"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"

	placement "github.com/gputopo/gputopo/api/placement/v1alpha1"
)

// Explain writes what the controller decided for a group of pods and why,
// from the annotations it left on the pods and the events it recorded.
func Explain(w io.Writer, group string, pods []v1.Pod, events []v1.Event) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d pods\n", group, len(pods))
	if len(pods) == 0 {
		b.WriteString("  no pods found: is the Job running, and does its pod template carry gputopo.dev/placement?\n")
	}
	slices.SortFunc(pods, func(a, c v1.Pod) int { return strings.Compare(a.Name, c.Name) })
	domains := map[string]bool{}
	for _, p := range pods {
		state := "placed"
		if slices.ContainsFunc(p.Spec.SchedulingGates, func(g v1.PodSchedulingGate) bool { return g.Name == placement.SchedulingGate }) {
			state = "waiting (gated)"
		}
		node := p.Spec.NodeName
		if node == "" {
			node = "-"
		}
		fmt.Fprintf(&b, "  %-32s %-16s node=%s\n", p.Name, state, node)
		if s := p.Annotations[placement.AnnotationStatus]; s != "" && state != "placed" {
			fmt.Fprintf(&b, "      why: %s\n", s)
		}
		if d := p.Annotations[placement.AnnotationDomain]; d != "" {
			domains[d] = true
		}
	}
	if len(domains) > 0 {
		fmt.Fprintf(&b, "domain: %s\n", strings.Join(slices.Sorted(mapKeys(domains)), " "))
	}
	slices.SortFunc(events, func(a, c v1.Event) int { return a.LastTimestamp.Compare(c.LastTimestamp.Time) })
	var lines []string
	for _, e := range events {
		if e.Source.Component != "gputopo-controller" && e.ReportingController != "gputopo-controller" {
			continue
		}
		lines = append(lines, fmt.Sprintf("  %s %s %s: %s", e.LastTimestamp.Format("15:04:05"), e.Type, e.Reason, e.Message))
	}
	if len(lines) > 0 {
		b.WriteString("decisions:\n" + strings.Join(lines, "\n") + "\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func mapKeys(m map[string]bool) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}
