package cli_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	placement "github.com/gputopo/gputopo/api/placement/v1alpha1"
	"github.com/gputopo/gputopo/pkg/cli"
)

func TestParseTarget(t *testing.T) {
	job, pod, jobset, group := placement.GroupKindJob, placement.GroupKindPod, placement.GroupKindJobSet, placement.GroupKindGroup
	for arg, want := range map[string]cli.Target{
		"train":                         {Name: "train"},
		"job/idx":                       {Kind: job, Name: "idx"},
		"jobs/idx":                      {Kind: job, Name: "idx"},
		"job.batch/idx":                 {Kind: job, Name: "idx"},
		"Job/idx":                       {Kind: job, Name: "idx"},
		"pod/x":                         {Kind: pod, Name: "x"},
		"pods/x":                        {Kind: pod, Name: "x"},
		"po/x":                          {Kind: pod, Name: "x"},
		"jobset/sweep":                  {Kind: jobset, Name: "sweep"},
		"jobsets.jobset.x-k8s.io/sweep": {Kind: jobset, Name: "sweep"},
		"group/g.v1":                    {Kind: group, Name: "g.v1"},
	} {
		got, err := cli.ParseTarget(arg)
		if err != nil {
			t.Errorf("ParseTarget(%q): %v", arg, err)
			continue
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("ParseTarget(%q) (-want +got):\n%s", arg, diff)
		}
	}
	for arg, problem := range map[string]string{
		"deployment/x": `"deployment" is not a kind explain knows`,
		"job/":         `"" is not the name of an object`,
		"job/a/b":      `"a/b" is not the name of an object`,
		"Train":        `"Train" is not the name of an object`,
		"":             `"" is not the name of an object`,
	} {
		_, err := cli.ParseTarget(arg)
		if err == nil || !strings.Contains(err.Error(), problem) || !strings.Contains(err.Error(), cli.TargetForms) {
			t.Errorf("ParseTarget(%q) = %v, want an error saying %s and naming the accepted forms", arg, err, problem)
		}
	}
}

func TestFetchExplanationTargets(t *testing.T) {
	f := newFixture(t)
	jobsetPod := func(name string) *v1.Pod {
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: name, Labels: map[string]string{cli.LabelJobSetName: "sweep"}}}
	}
	grouped := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "g-0", Annotations: map[string]string{placement.AnnotationGroup: "hpo"}}}
	c := f.client(&batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "train"}},
		&batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "idle"}},
		jobsetPod("sweep-w-0-0"), jobsetPod("sweep-w-1-0"), grouped)
	type found struct {
		Group string
		Kind  placement.GroupKind
		Pods  []string
	}
	for _, tc := range []struct {
		ns, arg string
		all     bool
		want    found
	}{
		{ns: "ml", arg: "job/train", want: found{"ml/train", placement.GroupKindJob, []string{"train-0"}}},
		{ns: "ml", arg: "jobs.batch/train", want: found{"ml/train", placement.GroupKindJob, []string{"train-0"}}},
		{ns: "ml", arg: "train", want: found{"ml/train", placement.GroupKindJob, []string{"train-0"}}},
		{ns: "ml", arg: "job/idle", want: found{"ml/idle", placement.GroupKindJob, nil}},
		{ns: "ml", arg: "pod/train-0", want: found{"ml/train-0", placement.GroupKindPod, []string{"train-0"}}},
		{ns: "ml", arg: "solo", want: found{"ml/solo", placement.GroupKindPod, []string{"solo"}}},
		{ns: "default", arg: "pods/solo", all: true, want: found{"ml/solo", placement.GroupKindPod, []string{"solo"}}},
		{ns: "ml", arg: "jobset/sweep", want: found{"ml/sweep", placement.GroupKindJobSet, []string{"sweep-w-0-0", "sweep-w-1-0"}}},
		{ns: "default", arg: "jobset/sweep", all: true, want: found{"ml/sweep", placement.GroupKindJobSet, []string{"sweep-w-0-0", "sweep-w-1-0"}}},
		{ns: "team", arg: "group/hpo", want: found{"team/hpo", placement.GroupKindGroup, []string{"g-0"}}},
		{ns: "default", arg: "hpo", all: true, want: found{"team/hpo", placement.GroupKindGroup, []string{"g-0"}}},
	} {
		target, err := cli.ParseTarget(tc.arg)
		if err != nil {
			t.Fatal(err)
		}
		e, err := cli.FetchExplanation(context.Background(), c, tc.ns, tc.all, target)
		if err != nil {
			t.Errorf("explain %s -n %s (-A %v): %v", tc.arg, tc.ns, tc.all, err)
			continue
		}
		got := found{Group: e.Group, Kind: e.GroupKind}
		for _, p := range e.Pods {
			got.Pods = append(got.Pods, p.Name)
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("explain %s -n %s (-A %v) (-want +got):\n%s", tc.arg, tc.ns, tc.all, diff)
		}
	}
	for _, arg := range []string{"job/solo", "pod/train", "jobset/train", "group/train", "nothing"} {
		target, err := cli.ParseTarget(arg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.FetchExplanation(context.Background(), c, "ml", false, target); !errors.Is(err, cli.ErrNotFound) || !strings.Contains(err.Error(), "-A") {
			t.Errorf("explain %s: err = %v, want ErrNotFound suggesting -A", arg, err)
		}
		if _, err := cli.FetchExplanation(context.Background(), c, "", true, target); !errors.Is(err, cli.ErrNotFound) {
			t.Errorf("explain %s -A: err = %v, want ErrNotFound", arg, err)
		}
	}
}
