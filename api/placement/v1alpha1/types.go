// Package v1alpha1 is how a workload asks gputopo for placement: a set of
// pod annotations, parsed and validated here. The same rules are enforced
// at admission by the ValidatingAdmissionPolicy in deployments/admission,
// so a bad value is refused when the pod (or its Job) is created.
package v1alpha1

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Annotation and label keys. Users set the first six on a pod template;
// the controller writes the rest.
const (
	Prefix = "gputopo.dev/"

	AnnotationPlacement         = Prefix + "placement"
	AnnotationPreferredDomain   = Prefix + "preferred-domain"
	AnnotationPreferredRequired = Prefix + "preferred-domain-required"
	AnnotationStrategy          = Prefix + "strategy"
	// AnnotationGroup and AnnotationGroupSize form a group out of pods that
	// have no controlling Job.
	AnnotationGroup     = Prefix + "group"
	AnnotationGroupSize = Prefix + "group-size"

	// AnnotationDomain is written by the controller on every placed pod:
	// the domain its group was given ("leaf leaf-1").
	AnnotationDomain = Prefix + "domain"
	// AnnotationStatus is written on a waiting pod: why its group is not
	// placed yet.
	AnnotationStatus = Prefix + "status"
	// AnnotationNode records the node a pod's claims were allocated on.
	AnnotationNode = Prefix + "node"
	// AnnotationReleased is written on a pod whose claims the controller
	// took back and allocated again: how often, and why the last time.
	AnnotationReleased = Prefix + "released"
	// AnnotationAllocatedBy is written on every ResourceClaim the
	// controller allocates: the group key, "<namespace>/<kind>/<name>".
	AnnotationAllocatedBy = Prefix + "allocated-by"

	// SchedulingGate keeps an opted-in pod out of the scheduler until the
	// controller has planned and pinned its whole group.
	SchedulingGate = Prefix + "topology"
)

// Placement values.
const (
	PlacementAuto           = "auto"
	PlacementSameLeaf       = "same-leaf"
	PlacementAdjacentLeaves = "adjacent-leaves"
	PlacementSameSpine      = "same-spine"
	PlacementNone           = "none"
)

// Strategy values.
const (
	StrategyConsolidated = "consolidated"
	StrategyBalanced     = "balanced"
	StrategyDistributed  = "distributed"
)

// Placements and Strategies list the accepted values in documentation order.
var (
	Placements = []string{PlacementAuto, PlacementSameLeaf, PlacementAdjacentLeaves, PlacementSameSpine, PlacementNone}
	Strategies = []string{StrategyConsolidated, StrategyBalanced, StrategyDistributed}
)

// MaxGroupSize bounds gputopo.dev/group-size.
const MaxGroupSize = 4096

// Request is a pod's placement request.
type Request struct {
	Placement         string
	PreferredDomain   string
	PreferredRequired bool
	Strategy          string
	Group             string
	GroupSize         int
}

// OptedIn reports whether the annotations ask for gputopo placement.
func OptedIn(annotations map[string]string) bool {
	_, ok := annotations[AnnotationPlacement]
	return ok
}

// Parse reads and validates a request, with the defaults filled in. Every
// problem is reported, each naming the annotation and what to write.
func Parse(annotations map[string]string) (Request, error) {
	r := Request{
		Placement:       annotations[AnnotationPlacement],
		PreferredDomain: annotations[AnnotationPreferredDomain],
		Strategy:        annotations[AnnotationStrategy],
		Group:           annotations[AnnotationGroup],
	}
	var errs []error
	if r.Placement == "" {
		r.Placement = PlacementAuto
	}
	if !contains(Placements, r.Placement) {
		errs = append(errs, fmt.Errorf("%s: %q is not one of %s", AnnotationPlacement, r.Placement, strings.Join(Placements, ", ")))
	}
	if r.Strategy == "" {
		r.Strategy = StrategyBalanced
	}
	if !contains(Strategies, r.Strategy) {
		errs = append(errs, fmt.Errorf("%s: %q is not one of %s", AnnotationStrategy, r.Strategy, strings.Join(Strategies, ", ")))
	}
	if r.PreferredDomain != "" {
		if msgs := validation.IsValidLabelValue(r.PreferredDomain); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("%s: %q must be a leaf or spine name as in the node labels: %s", AnnotationPreferredDomain, r.PreferredDomain, strings.Join(msgs, "; ")))
		}
	}
	if v, ok := annotations[AnnotationPreferredRequired]; ok {
		switch v {
		case "true":
			r.PreferredRequired = true
		case "false":
		default:
			errs = append(errs, fmt.Errorf("%s: %q must be \"true\" or \"false\"", AnnotationPreferredRequired, v))
		}
		if r.PreferredRequired && r.PreferredDomain == "" {
			errs = append(errs, fmt.Errorf("%s: \"true\" needs %s to name the domain", AnnotationPreferredRequired, AnnotationPreferredDomain))
		}
	}
	_, hasSize := annotations[AnnotationGroupSize]
	if r.Group != "" {
		if msgs := validation.IsDNS1123Subdomain(r.Group); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("%s: %q must be a DNS subdomain name: %s", AnnotationGroup, r.Group, strings.Join(msgs, "; ")))
		}
		if !hasSize {
			errs = append(errs, fmt.Errorf("%s needs %s: how many pods the group has", AnnotationGroup, AnnotationGroupSize))
		}
	}
	if hasSize {
		n, err := strconv.Atoi(annotations[AnnotationGroupSize])
		switch {
		case err != nil || n < 1 || n > MaxGroupSize:
			errs = append(errs, fmt.Errorf("%s: %q must be a whole number from 1 to %d", AnnotationGroupSize, annotations[AnnotationGroupSize], MaxGroupSize))
		case r.Group == "":
			errs = append(errs, fmt.Errorf("%s needs %s to name the group", AnnotationGroupSize, AnnotationGroup))
		default:
			r.GroupSize = n
		}
	}
	return r, errors.Join(errs...)
}

func contains(list []string, v string) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}
