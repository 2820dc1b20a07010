package v1alpha1

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func keyErr(where, in, problem string) *ValueError {
	return &ValueError{Key: where, Value: in, Problem: problem, Want: groupKeyForm}
}

func TestParseGroupKey(t *testing.T) {
	testParse(t, ParseGroupKey, GroupKey.Format, map[string]parseCase[GroupKey]{
		"job":    {in: "default/job/train", want: GroupKey{Namespace: "default", Kind: GroupKindJob, Name: "train"}},
		"jobset": {in: "ml/jobset/pretrain", want: GroupKey{Namespace: "ml", Kind: GroupKindJobSet, Name: "pretrain"}},
		"lws":    {in: "ml/lws/serve-3", want: GroupKey{Namespace: "ml", Kind: GroupKindLWS, Name: "serve-3"}},
		"group":  {in: "ml/group/ring.a", want: GroupKey{Namespace: "ml", Kind: GroupKindGroup, Name: "ring.a"}},
		"pod":    {in: "ml/pod/nvlink-quad", want: GroupKey{Namespace: "ml", Kind: GroupKindPod, Name: "nvlink-quad"}},

		"two parts":    {in: "default/train", wantErr: keyErr("group key", "default/train", `has 2 parts separated by "/", not 3`)},
		"four parts":   {in: "default/job/a/b", wantErr: keyErr("group key", "default/job/a/b", `has 4 parts separated by "/", not 3`)},
		"unknown kind": {in: "default/deployment/web", wantErr: keyErr("group key", "default/deployment/web", `has the unknown kind "deployment"`)},
		"kind case":    {in: "default/Job/train", wantErr: keyErr("group key", "default/Job/train", `has the unknown kind "Job"`)},
		"no namespace": {in: "/job/train", wantErr: keyErr("group key", "/job/train",
			`has the bad namespace ""`), detail: true},
		"dotted namespace": {in: "a.b/job/train", wantErr: keyErr("group key", "a.b/job/train",
			`has the bad namespace "a.b"`), detail: true},
		"no name": {in: "default/job/", wantErr: keyErr("group key", "default/job/",
			`has the bad name ""`), detail: true},
	})
}

func TestParseAllocatedBy(t *testing.T) {
	testParse(t, ParseAllocatedBy, GroupKey.Format, map[string]parseCase[GroupKey]{
		"job": {in: "default/job/train", want: GroupKey{Namespace: "default", Kind: GroupKindJob, Name: "train"}},
		"malformed": {in: "default/train",
			wantErr: keyErr(AnnotationAllocatedBy, "default/train", `has 2 parts separated by "/", not 3`)},
	})
}

func TestGroupKeyValidate(t *testing.T) {
	long := strings.Repeat("a", 254)
	k := GroupKey{Namespace: "default", Kind: GroupKindJob, Name: long}
	var got *ValueError
	if !errors.As(k.Validate(), &got) {
		t.Fatalf("Validate() of a 254-character name = %v, want a *ValueError", k.Validate())
	}
	want := keyErr("group key", "default/job/"+long, `has the bad name "`+long+`"`)
	trimDetail(got, want)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Validate() (-want +got):\n%s", diff)
	}
	k = GroupKey{Namespace: "default", Kind: GroupKindLWS, Name: "serve-0"}
	if err := k.Validate(); err != nil {
		t.Error(err)
	}
	if diff := cmp.Diff("default/lws/serve-0", k.String()); diff != "" {
		t.Errorf("String() (-want +got):\n%s", diff)
	}
}

func FuzzParseGroupKey(f *testing.F) {
	for _, s := range []string{"default/job/train", "ml/lws/serve-0", "a/b", "/job/x", "ns/pod/a.b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		fuzzParse(t, "group key", s, ParseGroupKey, GroupKey.Format, GroupKey.Validate)
	})
}
