// Package v1alpha1 is gputopo's placement API: how a workload asks for
// placement (pod annotations a user sets, parsed and validated by Parse),
// and the decision the controller records (annotations on pods and on the
// ResourceClaims it allocates, read and written by the typed values in
// decision.go). The user's annotations are also checked at admission by the
// ValidatingAdmissionPolicy in deployments/admission, which refuses exactly
// the values Parse refuses, with Parse's messages, when the pod (or its Job)
// is created, and keeps the controller-written annotations to the
// controller; policy_cel_test.go evaluates the policy and compares.
//
// The package imports no client-go and no controller code, so the planner
// and the controller share these types.
package v1alpha1

import (
	"errors"
	"fmt"
	"slices"
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

	// AnnotationDomain is written by the controller on every placed pod and
	// on every ResourceClaim it allocates: the domain the group was given,
	// as Domain.Format writes it ("leaf:leaf-2").
	AnnotationDomain = Prefix + "domain"
	// AnnotationNode is written on a placed pod: the node its claims were
	// allocated on, a plain node name.
	AnnotationNode = Prefix + "node"
	// AnnotationStatus is written on a waiting pod: why its group is not
	// placed yet, as Status.Format writes it ("Unschedulable: ...").
	AnnotationStatus = Prefix + "status"
	// AnnotationReleased is written on a pod whose group was released and
	// planned again: how often and why the last time, as Release.Format
	// writes it ("2;NodeNotReady").
	AnnotationReleased = Prefix + "released"
	// AnnotationAllocatedBy is written on every ResourceClaim the
	// controller allocates: the group it was allocated for, as
	// GroupKey.Format writes it ("default/job/train").
	AnnotationAllocatedBy = Prefix + "allocated-by"
	// AnnotationReservation is written on the waiting pods of the group
	// that holds the controller's reservation: the nodes kept free for it
	// and until when, as Reservation.Format writes it
	// ("2026-11-26T10:05:00Z;leaf:leaf-2;n1,n2"). It is removed when the
	// reservation ends, and means nothing on a pod whose gate is open.
	AnnotationReservation = Prefix + "reservation"

	// SchedulingGate keeps an opted-in pod out of the scheduler until the
	// controller has planned its whole group and allocated its claims.
	SchedulingGate = Prefix + "topology"

	// ConditionPlaced is the pod condition the controller keeps on a pod
	// it had to keep waiting: False with the reason and message of
	// AnnotationStatus while it waits, True (reason Placed) once its gate
	// opens. `kubectl describe pod` and queue controllers read it.
	ConditionPlaced = Prefix + "Placed"
)

// UserAnnotations are the annotations a user sets on a pod template and
// Parse reads, in documentation order. Admission refuses exactly the values
// Parse refuses (deployments/admission/placement-validation.yaml), and
// warns about any other gputopo.dev/ key on a pod or pod template that is in
// neither this list nor ControllerAnnotations.
var UserAnnotations = []string{AnnotationPlacement, AnnotationStrategy, AnnotationPreferredDomain, AnnotationPreferredRequired, AnnotationGroup, AnnotationGroupSize}

// ControllerAnnotations are the annotations only the controller writes. The
// gputopo-placement admission policy refuses to create a Pod, Job,
// ResourceClaim or ResourceClaimTemplate that carries one, and refuses an
// update that sets, changes or removes one unless the requester holds the
// controller's permission below.
var ControllerAnnotations = []string{AnnotationDomain, AnnotationNode, AnnotationStatus, AnnotationReleased, AnnotationAllocatedBy, AnnotationReservation}

// The permission that lets a request write ControllerAnnotations: verb
// "update" on the resource "placements" of the API group "gputopo.dev". No
// such API is served; RBAC grants it like any other rule, and the Helm
// chart grants it to the controller's ServiceAccount.
const (
	ControllerPermissionGroup    = "gputopo.dev"
	ControllerPermissionResource = "placements"
	ControllerPermissionVerb     = "update"
)

// Placement says how close together a group's pods must be.
type Placement string

const (
	// PlacementAuto picks the smallest subtree that holds the group.
	PlacementAuto Placement = "auto"
	// PlacementSameLeaf requires every pod under one leaf switch.
	PlacementSameLeaf Placement = "same-leaf"
	// PlacementAdjacentLeaves requires a run of adjacent leaves under one
	// spine (a single leaf is the shortest run).
	PlacementAdjacentLeaves Placement = "adjacent-leaves"
	// PlacementSameSpine requires every pod under one spine.
	PlacementSameSpine Placement = "same-spine"
	// PlacementNone places pods like the plain scheduler: anywhere, first
	// fit in strategy order.
	PlacementNone Placement = "none"
)

// Strategy says how pods spread over the nodes of the chosen domain.
type Strategy string

const (
	// StrategyConsolidated packs pods onto as few nodes as possible, the
	// fullest nodes first.
	StrategyConsolidated Strategy = "consolidated"
	// StrategyBalanced spreads pods evenly over the domain's nodes, filling
	// nodes that are already partly used before empty ones. The default.
	StrategyBalanced Strategy = "balanced"
	// StrategyDistributed puts one pod per node where possible and spreads
	// pods across the domain's leaves.
	StrategyDistributed Strategy = "distributed"
)

// Placements and Strategies list the accepted values in documentation order.
var (
	Placements = []Placement{PlacementAuto, PlacementSameLeaf, PlacementAdjacentLeaves, PlacementSameSpine, PlacementNone}
	Strategies = []Strategy{StrategyConsolidated, StrategyBalanced, StrategyDistributed}
)

// MaxGroupSize bounds gputopo.dev/group-size.
const MaxGroupSize = 4096

// Request is a pod's placement request.
type Request struct {
	Placement         Placement
	PreferredDomain   string
	PreferredRequired bool
	Strategy          Strategy
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
		Placement:       Placement(annotations[AnnotationPlacement]),
		PreferredDomain: annotations[AnnotationPreferredDomain],
		Strategy:        Strategy(annotations[AnnotationStrategy]),
		Group:           annotations[AnnotationGroup],
	}
	var errs []error
	if r.Placement == "" {
		r.Placement = PlacementAuto
	}
	if !slices.Contains(Placements, r.Placement) {
		errs = append(errs, fmt.Errorf("%s: %q is not one of %s", AnnotationPlacement, r.Placement, join(Placements)))
	}
	if r.Strategy == "" {
		r.Strategy = StrategyBalanced
	}
	if !slices.Contains(Strategies, r.Strategy) {
		errs = append(errs, fmt.Errorf("%s: %q is not one of %s", AnnotationStrategy, r.Strategy, join(Strategies)))
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
			errs = append(errs, fmt.Errorf("%s: %q is not a valid group name: %s", AnnotationGroup, r.Group, strings.Join(msgs, "; ")))
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

// join lists enum values for a message.
func join[T ~string](values []T) string {
	parts := make([]string, len(values))
	for i, v := range values {
		parts[i] = string(v)
	}
	return strings.Join(parts, ", ")
}
