package cli

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"

	placement "github.com/gputopo/gputopo/api/placement/v1alpha1"
)

// WaitingGroup is a group whose pods gputopo's gate still holds: why it
// waits, and the nodes kept free for it when it holds the reservation.
type WaitingGroup struct {
	// Group is the namespace/name of its Job, gputopo.dev/group or pod.
	Group string `json:"group"`
	// Pods counts its pods that wait.
	Pods int `json:"pods"`
	// Since is when its oldest waiting pod was created.
	Since time.Time `json:"since"`
	// Reason and Message are the controller's gputopo.dev/status;
	// empty while it has not written one.
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	// Reservation is set while the group holds the controller's
	// reservation.
	Reservation *ReservationView `json:"reservation,omitempty"`
}

// ReservationView is the nodes reserved for a waiting group.
type ReservationView struct {
	Domain string    `json:"domain"`
	Nodes  []string  `json:"nodes"`
	Until  time.Time `json:"until"`
}

// BuildWaiting lists the groups whose pods carry gputopo's scheduling
// gate, oldest first. A reservation past its time at now is left out.
func BuildWaiting(pods []v1.Pod, now time.Time) []WaitingGroup {
	byGroup := map[string]*WaitingGroup{}
	for i := range pods {
		p := &pods[i]
		if p.DeletionTimestamp != nil || !slices.ContainsFunc(p.Spec.SchedulingGates, func(g v1.PodSchedulingGate) bool { return g.Name == placement.SchedulingGate }) {
			continue
		}
		name := podHolder(p)
		g := byGroup[name]
		if g == nil {
			g = &WaitingGroup{Group: name, Since: p.CreationTimestamp.Time}
			byGroup[name] = g
		}
		g.Pods++
		if t := p.CreationTimestamp.Time; t.Before(g.Since) {
			g.Since = t
		}
		if st, err := placement.ParseStatus(p.Annotations[placement.AnnotationStatus]); err == nil && g.Reason == "" {
			g.Reason, g.Message = st.Reason, st.Message
		}
		if r, err := placement.ParseReservation(p.Annotations[placement.AnnotationReservation]); err == nil && r.Active(now) && g.Reservation == nil {
			g.Reservation = &ReservationView{Domain: r.Domain.String(), Nodes: r.Nodes, Until: r.Until}
		}
	}
	out := make([]WaitingGroup, 0, len(byGroup))
	for _, g := range byGroup {
		out = append(out, *g)
	}
	slices.SortFunc(out, func(a, b WaitingGroup) int { return cmp.Or(a.Since.Compare(b.Since), natCmp(a.Group, b.Group)) })
	return out
}

// MarkReserved records on each reserved node whom it is kept for.
func MarkReserved(views []NodeView, waiting []WaitingGroup) {
	reservedFor := map[string]string{}
	for _, g := range waiting {
		if g.Reservation != nil {
			for _, n := range g.Reservation.Nodes {
				reservedFor[n] = g.Group
			}
		}
	}
	for i := range views {
		views[i].ReservedFor = reservedFor[views[i].Name]
	}
}

// waitingLines is the text view's last section: one line per waiting
// group, its reason cut to width runes unless wide.
func waitingLines(waiting []WaitingGroup, wide bool, pal palette) string {
	if len(waiting) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "waiting: %s\n", plural(len(waiting), "group"))
	w := 0
	for _, g := range waiting {
		w = max(w, len(g.Group))
	}
	for i, g := range waiting {
		line := fmt.Sprintf("%s %-*s  %s", branch(i == len(waiting)-1), w, g.Group, plural(g.Pods, "pod"))
		if g.Reason != "" {
			why := g.Reason + ": " + g.Message
			if r := []rune(why); !wide && len(r) > 100 {
				why = string(r[:99]) + "…"
			}
			line += "  " + why
		}
		if r := g.Reservation; r != nil {
			line += "  " + pal.bold(fmt.Sprintf("reserved %s in %s until %s", strings.Join(r.Nodes, ","), r.Domain, r.Until.Local().Format(time.TimeOnly)))
		}
		b.WriteString(line + "\n")
	}
	return b.String()
}
