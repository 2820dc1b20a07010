package v1alpha1

import (
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Reservation is what AnnotationReservation records on the waiting pods
// of the group that holds the controller's reservation: the nodes kept
// free for it, in which domain, until when. The controller holds one
// reservation at a time; views show it, and a pod whose gate is open, or
// whose reservation is past Until, holds none.
type Reservation struct {
	Until  time.Time
	Domain Domain
	Nodes  []string
}

const reservationForm = "<until, RFC 3339>;<domain>;<node>[,<node>...], such as \"2026-11-26T10:05:00Z;leaf:leaf-2;n1,n2\""

// Format writes the reservation as AnnotationReservation holds it:
// "<until>;<domain>;<nodes>", the time in UTC to the second.
func (r Reservation) Format() string {
	return r.Until.UTC().Format(time.RFC3339) + ";" + r.Domain.Format() + ";" + strings.Join(r.Nodes, ",")
}

// Validate checks the domain and the node names.
func (r Reservation) Validate() error {
	if p := r.problem(); p != "" {
		return &ValueError{Key: AnnotationReservation, Value: r.Format(), Problem: p, Want: reservationForm}
	}
	return nil
}

func (r Reservation) problem() string {
	if p := r.Domain.problem(); p != "" {
		return "has a domain that " + p
	}
	if len(r.Nodes) == 0 {
		return "names no node"
	}
	for _, n := range r.Nodes {
		if msgs := validation.IsDNS1123Subdomain(n); len(msgs) > 0 {
			return fmt.Sprintf("has %q among its nodes, which is not a node name: %s", n, strings.Join(msgs, "; "))
		}
	}
	return ""
}

// Active reports whether the reservation still holds at now.
func (r Reservation) Active(now time.Time) bool { return now.Before(r.Until) }

// ParseReservation reads what Reservation.Format writes.
func ParseReservation(v string) (Reservation, error) {
	parts := strings.Split(v, ";")
	if len(parts) != 3 {
		return Reservation{}, &ValueError{Key: AnnotationReservation, Value: v, Problem: fmt.Sprintf("has %d parts separated by \";\", not 3", len(parts)), Want: reservationForm}
	}
	until, err := time.Parse(time.RFC3339, parts[0])
	if err != nil || until.UTC().Format(time.RFC3339) != parts[0] {
		return Reservation{}, &ValueError{Key: AnnotationReservation, Value: v, Problem: fmt.Sprintf("has the time %q, not an RFC 3339 time in UTC", parts[0]), Want: reservationForm}
	}
	d, err := ParseDomain(parts[1])
	if err != nil {
		return Reservation{}, &ValueError{Key: AnnotationReservation, Value: v, Problem: fmt.Sprintf("has the domain %q, which is not one", parts[1]), Want: reservationForm}
	}
	r := Reservation{Until: until, Domain: d}
	if parts[2] != "" {
		r.Nodes = strings.Split(parts[2], ",")
	}
	if p := r.problem(); p != "" {
		return Reservation{}, &ValueError{Key: AnnotationReservation, Value: v, Problem: p, Want: reservationForm}
	}
	return r, nil
}
