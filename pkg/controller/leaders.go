package controller

import (
	"context"
	"fmt"
	"slices"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/gputopo/gputopo/pkg/planner"
)

// JobSet's exclusive placement gives each Job of a JobSet a value of a
// topology key (a leaf) to itself. Its webhook gives each Job's leader
// pod (completion index 0) required pod affinity to its own Job's pods
// and anti-affinity to every other Job's on that key, and admits the
// Job's other pods, the followers, only once the leader is scheduled,
// with a node selector for the leader's value. A group that waited for
// all its pods would wait forever: the followers wait for the leaders,
// which wait behind gputopo's gate. So the controller plans such a
// JobSet once its leaders exist, with each Job's followers stood in for
// by copies of its leader (the same claims, requests and terms: the
// followers come from the same template), so that each leader goes where
// its whole Job fits. It writes the leaders' claims only and holds the
// followers' planned devices from other groups' plans until the
// followers exist and are planned, or for the bind timeout; the
// followers are then planned into the group's domain as any grown group
// is, their node selector keeping them in their leader's value.

// followersDue is how many pods of a Job with a leader are not created
// yet.
type followersDue struct {
	leader *v1.Pod
	n      int
}

// leadersFirst reports whether the pods use JobSet's exclusive placement
// with its affinity strategy, which creates followers after leaders.
func leadersFirst(pods []*v1.Pod) bool {
	for _, p := range pods {
		if _, ok := p.Annotations[annotationJobSetExclusive]; ok {
			_, nodeSelector := p.Annotations[annotationJobSetNodeSelector]
			return !nodeSelector
		}
	}
	return false
}

// dueFollowers lists, for each Job of the JobSet whose leader pod
// exists, how many of its pods do not exist yet.
func dueFollowers(jobs []*batchv1.Job, pods []*v1.Pod) []followersDue {
	byJob := map[types.UID][]*v1.Pod{}
	for _, p := range pods {
		if ref := metav1.GetControllerOf(p); ref != nil && ref.Kind == "Job" {
			byJob[ref.UID] = append(byJob[ref.UID], p)
		}
	}
	var out []followersDue
	for _, j := range jobs {
		if j.DeletionTimestamp != nil {
			continue
		}
		ps := byJob[j.UID]
		i := slices.IndexFunc(ps, func(p *v1.Pod) bool { return p.Annotations[batchv1.JobCompletionIndexAnnotation] == "0" })
		if i < 0 {
			continue
		}
		if n := jobSize(j) - len(ps); n > 0 {
			out = append(out, followersDue{leader: ps[i], n: n})
		}
	}
	return out
}

// dueCount is how many pods of the group are due after their leaders.
func (g *group) dueCount() int {
	n := 0
	for _, d := range g.due {
		n += d.n
	}
	return n
}

// phantomFollowers stands in for the followers due of each leader the
// group plans now: copies of the leader's planner pod (pods holds each
// unit's, in order), named "<leader>/follower-<i>", with claims of their
// own named after them.
func phantomFollowers(due []followersDue, units []*unit, pods []planner.Pod) []planner.Pod {
	var out []planner.Pod
	for _, d := range due {
		i := slices.IndexFunc(units, func(u *unit) bool {
			return slices.ContainsFunc(u.members, func(m *member) bool { return m.pod.UID == d.leader.UID })
		})
		if i < 0 {
			continue // the leader is placed already: its followers come now
		}
		base := pods[i]
		for k := 1; k <= d.n; k++ {
			p := base
			p.Name = fmt.Sprintf("%s/follower-%d", d.leader.Name, k)
			p.Claims = make([]*resourceapi.ResourceClaim, len(base.Claims))
			for j, cl := range base.Claims {
				c := cl.DeepCopy()
				c.Name = fmt.Sprintf("%s/follower-%d", cl.Name, k)
				c.UID = types.UID(fmt.Sprintf("%s/follower-%d", cl.UID, k))
				c.Status = resourceapi.ResourceClaimStatus{}
				p.Claims[j] = c
			}
			out = append(out, p)
		}
	}
	return out
}

// holdFollowers takes the followers out of the plan, whose writes are
// the real pods', and holds their devices from other groups' plans
// (trackInflight ends the hold; steer keeps it beside its own). It
// reports whether it holds them.
func (c *Controller) holdFollowers(ctx context.Context, key string, plan *planner.Plan, followers []planner.Pod) (*planner.Plan, bool) {
	plan, hold := plan.Split(followers)
	if err := c.inflight.Add(hold); err != nil {
		klog.FromContext(ctx).V(2).Info("The followers' devices are held by another group", "group", key, "err", err)
		return plan, false
	}
	c.mu.Lock()
	c.inflightAt[key] = time.Now()
	c.mu.Unlock()
	return plan, true
}
