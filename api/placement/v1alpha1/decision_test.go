package v1alpha1

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// parseCase is one input of a Parse function: the value it must return,
// or the error.
type parseCase[T any] struct {
	in      string
	want    T
	wantErr *ValueError
	// detail: the error's Problem goes on after wantErr.Problem with ": "
	// and the explanation of the validation library.
	detail bool
}

// trimDetail cuts got.Problem back to want.Problem when it goes on with
// ": " and a further explanation.
func trimDetail(got, want *ValueError) {
	if got == nil || want == nil {
		return
	}
	if rest, ok := strings.CutPrefix(got.Problem, want.Problem+": "); ok && rest != "" {
		got.Problem = want.Problem
	}
}

// testParse runs parse on every case. A value that parses must be written
// back by format as the very input; a malformed one must be refused with a
// *ValueError naming the annotation, the value, the problem and the form.
func testParse[T any](t *testing.T, parse func(string) (T, error), format func(T) string, cases map[string]parseCase[T]) {
	t.Helper()
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := parse(tc.in)
			if tc.wantErr != nil {
				var ve *ValueError
				if !errors.As(err, &ve) {
					t.Fatalf("parse %q = %+v, %v; want a *ValueError", tc.in, got, err)
				}
				if tc.detail {
					trimDetail(ve, tc.wantErr)
				}
				if diff := cmp.Diff(tc.wantErr, ve); diff != "" {
					t.Errorf("parse %q: error (-want +got):\n%s", tc.in, diff)
				}
				return
			}
			if err != nil {
				t.Fatalf("parse %q: %v", tc.in, err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("parse %q (-want +got):\n%s", tc.in, diff)
			}
			if out := format(got); out != tc.in {
				t.Errorf("format(parse(%q)) = %q", tc.in, out)
			}
		})
	}
}

// fuzzParse checks the round trip both ways: whatever parses is written
// back unchanged and validates, and whatever does not is a *ValueError
// for that value.
func fuzzParse[T any](t *testing.T, key, in string, parse func(string) (T, error), format func(T) string, validate func(T) error) {
	v, err := parse(in)
	if err != nil {
		var ve *ValueError
		if !errors.As(err, &ve) || ve.Key != key || ve.Value != in || ve.Problem == "" || ve.Want == "" {
			t.Fatalf("parse %q: error %#v, want a *ValueError for %s naming the value", in, err, key)
		}
		return
	}
	if out := format(v); out != in {
		t.Fatalf("format(parse(%q)) = %q", in, out)
	}
	if err := validate(v); err != nil {
		t.Fatalf("parse %q accepted %+v, which does not validate: %v", in, v, err)
	}
}

func domainErr(in, problem string) *ValueError {
	return &ValueError{Key: AnnotationDomain, Value: in, Problem: problem, Want: domainForm}
}

func TestParseDomain(t *testing.T) {
	long := strings.Repeat("a", 64)
	testParse(t, ParseDomain, Domain.Format, map[string]parseCase[Domain]{
		"leaf":          {in: "leaf:leaf-2", want: Domain{Level: LevelLeaf, Names: []string{"leaf-2"}}},
		"leaves":        {in: "leaves:leaf-2,leaf-3", want: Domain{Level: LevelLeaves, Names: []string{"leaf-2", "leaf-3"}}},
		"spine":         {in: "spine:spine-0", want: Domain{Level: LevelSpine, Names: []string{"spine-0"}}},
		"node":          {in: "node:gpu-1.rack-2.example.com", want: Domain{Level: LevelNode, Names: []string{"gpu-1.rack-2.example.com"}}},
		"whole cluster": {in: "cluster:", want: Domain{Level: LevelCluster}},
		"spines":        {in: "cluster:spine-0,spine-1", want: Domain{Level: LevelCluster, Names: []string{"spine-0", "spine-1"}}},
		"label value":   {in: "leaf:Leaf_2.A", want: Domain{Level: LevelLeaf, Names: []string{"Leaf_2.A"}}},

		"empty":             {in: "", wantErr: domainErr("", "has no colon after the level")},
		"phrase":            {in: "leaf leaf-1", wantErr: domainErr("leaf leaf-1", "has no colon after the level")},
		"no level":          {in: ":leaf-1", wantErr: domainErr(":leaf-1", "has no level")},
		"unknown level":     {in: "rack:r1", wantErr: domainErr("rack:r1", `has the unknown level "rack"`)},
		"level case":        {in: "Leaf:leaf-1", wantErr: domainErr("Leaf:leaf-1", `has the unknown level "Leaf"`)},
		"leaf without name": {in: "leaf:", wantErr: domainErr("leaf:", "has 0 names; leaf takes exactly one")},
		"two leaves":        {in: "leaf:a,b", wantErr: domainErr("leaf:a,b", "has 2 names; leaf takes exactly one")},
		"two nodes":         {in: "node:a,b", wantErr: domainErr("node:a,b", "has 2 names; node takes exactly one")},
		"one of leaves": {in: "leaves:leaf-1",
			wantErr: domainErr("leaves:leaf-1", "has 1 names; leaves takes two or more (one leaf is leaf:<leaf>)")},
		"one spine in cluster": {in: "cluster:spine-0",
			wantErr: domainErr("cluster:spine-0", "has one name; cluster takes none (the whole cluster) or two or more spines (one spine is spine:<spine>)")},
		"empty name": {in: "leaves:a,,b", wantErr: domainErr("leaves:a,,b", `has the bad name ""`), detail: true},
		"trailing comma": {in: "leaves:a,b,",
			wantErr: domainErr("leaves:a,b,", `has the bad name ""`), detail: true},
		"repeated": {in: "leaves:a,a", wantErr: domainErr("leaves:a,a", `names "a" twice`)},
		"space": {in: "leaf:leaf 1",
			wantErr: domainErr("leaf:leaf 1", `has the bad name "leaf 1"`), detail: true},
		"second colon": {in: "leaf:a:b",
			wantErr: domainErr("leaf:a:b", `has the bad name "a:b"`), detail: true},
		"too long": {in: "spine:" + long,
			wantErr: domainErr("spine:"+long, `has the bad name "`+long+`"`), detail: true},
		"node upper case": {in: "node:GPU-1",
			wantErr: domainErr("node:GPU-1", `has the bad name "GPU-1"`), detail: true},
	})
}

func TestDomainValidate(t *testing.T) {
	for name, tc := range map[string]struct {
		d    Domain
		want *ValueError
	}{
		"valid":        {d: Domain{Level: LevelLeaves, Names: []string{"a", "b"}}},
		"empty names":  {d: Domain{Level: LevelCluster, Names: []string{}}},
		"no level":     {d: Domain{Names: []string{"a"}}, want: domainErr(":a", "has no level")},
		"comma inside": {d: Domain{Level: LevelLeaves, Names: []string{"a,b", "c"}}, want: domainErr("leaves:a,b,c", `has the bad name "a,b"`)},
	} {
		t.Run(name, func(t *testing.T) {
			err := tc.d.Validate()
			var got *ValueError
			if err != nil && !errors.As(err, &got) {
				t.Fatalf("Validate() = %v, want a *ValueError", err)
			}
			trimDetail(got, tc.want)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Validate() (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDomainString(t *testing.T) {
	for d, want := range map[string]string{
		"leaf:leaf-1":       "leaf leaf-1",
		"leaves:a,b":        "leaves a,b",
		"cluster:":          "the whole cluster",
		"cluster:s-0,s-1":   "spines s-0,s-1",
		"node:gpu-s0-l0-n0": "node gpu-s0-l0-n0",
	} {
		dom, err := ParseDomain(d)
		if err != nil {
			t.Fatal(err)
		}
		if got := dom.String(); got != want {
			t.Errorf("%s: String() = %q, want %q", d, got, want)
		}
	}
}

func TestParseNode(t *testing.T) {
	testParse(t, ParseNode, func(s string) string { return s }, map[string]parseCase[string]{
		"name":       {in: "gpu-s0-l0-n0", want: "gpu-s0-l0-n0"},
		"fqdn":       {in: "gpu-1.example.com", want: "gpu-1.example.com"},
		"empty":      {in: "", wantErr: &ValueError{Key: AnnotationNode, Value: "", Problem: "is not a node name", Want: "the name of a node"}, detail: true},
		"upper case": {in: "GPU-1", wantErr: &ValueError{Key: AnnotationNode, Value: "GPU-1", Problem: "is not a node name", Want: "the name of a node"}, detail: true},
		"domain":     {in: "node:gpu-1", wantErr: &ValueError{Key: AnnotationNode, Value: "node:gpu-1", Problem: "is not a node name", Want: "the name of a node"}, detail: true},
	})
}

func statusErr(in, problem string) *ValueError {
	return &ValueError{Key: AnnotationStatus, Value: in, Problem: problem, Want: statusForm}
}

func TestParseStatus(t *testing.T) {
	max := strings.Repeat("x", MaxStatusMessage)
	testParse(t, ParseStatus, Status.Format, map[string]parseCase[Status]{
		"unschedulable": {in: "Unschedulable: job default/job/big: no leaf can hold 5 pods; best: leaf leaf-1 (4 pods)",
			want: Status{Reason: StatusUnschedulable, Message: "job default/job/big: no leaf can hold 5 pods; best: leaf leaf-1 (4 pods)"}},
		"colon in message":   {in: "InvalidClaim: pod a: claim b: class c: not found", want: Status{Reason: StatusInvalidClaim, Message: "pod a: claim b: class c: not found"}},
		"longest message":    {in: "WaitingForPods: " + max, want: Status{Reason: StatusWaitingForPods, Message: max}},
		"other reason":       {in: "Released2: again", want: Status{Reason: "Released2", Message: "again"}},
		"no separator":       {in: "no leaf can hold 5 pods", wantErr: statusErr("no leaf can hold 5 pods", `has no ": " after the reason`)},
		"no space":           {in: "Unschedulable:full", wantErr: statusErr("Unschedulable:full", `has no ": " after the reason`)},
		"lower-case reason":  {in: "unschedulable: full", wantErr: statusErr("unschedulable: full", `has the reason "unschedulable", which is not one UpperCamelCase word of at most 64 characters`)},
		"two-word reason":    {in: "Not Placed: full", wantErr: statusErr("Not Placed: full", `has the reason "Not Placed", which is not one UpperCamelCase word of at most 64 characters`)},
		"no message":         {in: "Unschedulable: ", wantErr: statusErr("Unschedulable: ", "has no message")},
		"message over limit": {in: "Unschedulable: " + max + "y", wantErr: statusErr("Unschedulable: "+max+"y", "has a message of 1001 bytes, more than 1000")},
	})
}

func TestStatusFormatTruncates(t *testing.T) {
	// 998 bytes, then a three-byte rune that must not be split.
	msg := strings.Repeat("x", 996) + "€€"
	got := Status{Reason: StatusUnschedulable, Message: msg}.Format()
	want := "Unschedulable: " + strings.Repeat("x", 996) + "..."
	if got != want {
		t.Errorf("Format() = ...%q, want ...%q", got[len(got)-10:], want[len(want)-10:])
	}
	s, err := ParseStatus(got)
	if err != nil {
		t.Fatalf("a truncated status does not parse: %v", err)
	}
	if len(s.Message) > MaxStatusMessage {
		t.Errorf("message of %d bytes", len(s.Message))
	}
}

func releaseErr(in, problem string) *ValueError {
	return &ValueError{Key: AnnotationReleased, Value: in, Problem: problem, Want: releaseForm}
}

func TestParseRelease(t *testing.T) {
	testParse(t, ParseRelease, Release.Format, map[string]parseCase[Release]{
		"first":         {in: "1;BindTimeout", want: Release{Count: 1, Reason: ReleaseBindTimeout}},
		"second":        {in: "2;NodeNotReady", want: Release{Count: 2, Reason: ReleaseNodeNotReady}},
		"largest":       {in: "2147483647;NodeDeleted", want: Release{Count: 2147483647, Reason: ReleaseNodeDeleted}},
		"no separator":  {in: "2", wantErr: releaseErr("2", `has no ";" after the count`)},
		"reason first":  {in: "NodeNotReady;2", wantErr: releaseErr("NodeNotReady;2", `has the count "NodeNotReady", not a whole number`)},
		"leading zero":  {in: "02;NodeNotReady", wantErr: releaseErr("02;NodeNotReady", `has the count "02", not a whole number`)},
		"plus":          {in: "+2;NodeNotReady", wantErr: releaseErr("+2;NodeNotReady", `has the count "+2", not a whole number`)},
		"space":         {in: "2; NodeNotReady", wantErr: releaseErr("2; NodeNotReady", `has the reason " NodeNotReady", which is not one UpperCamelCase word of at most 64 characters`)},
		"zero":          {in: "0;NodeNotReady", wantErr: releaseErr("0;NodeNotReady", "has the count 0, not a whole number from 1 to 2147483647")},
		"negative":      {in: "-1;NodeNotReady", wantErr: releaseErr("-1;NodeNotReady", "has the count -1, not a whole number from 1 to 2147483647")},
		"too many":      {in: "2147483648;NodeNotReady", wantErr: releaseErr("2147483648;NodeNotReady", "has the count 2147483648, not a whole number from 1 to 2147483647")},
		"no reason":     {in: "2;", wantErr: releaseErr("2;", `has the reason "", which is not one UpperCamelCase word of at most 64 characters`)},
		"second reason": {in: "2;NodeNotReady;BindTimeout", wantErr: releaseErr("2;NodeNotReady;BindTimeout", `has the reason "NodeNotReady;BindTimeout", which is not one UpperCamelCase word of at most 64 characters`)},
	})
}

func TestReleaseNext(t *testing.T) {
	var r Release // no release yet
	r = r.Next(ReleaseBindTimeout).Next(ReleaseNodeTainted)
	if diff := cmp.Diff(Release{Count: 2, Reason: ReleaseNodeTainted}, r); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if err := r.Validate(); err != nil {
		t.Error(err)
	}
}

func TestValueErrorMessage(t *testing.T) {
	_, err := ParseRelease("two;NodeNotReady")
	want := `gputopo.dev/released: "two;NodeNotReady" has the count "two", not a whole number; want <count>;<Reason>, such as "2;NodeNotReady", with a count from 1 and an UpperCamelCase reason`
	if err == nil || err.Error() != want {
		t.Errorf("error = %v\nwant    %s", err, want)
	}
}

func FuzzParseDomain(f *testing.F) {
	for _, s := range []string{"leaf:leaf-2", "leaves:leaf-2,leaf-3", "spine:spine-0", "cluster:", "cluster:a,b", "node:gpu-1", "leaf:", "leaves:a,a"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		fuzzParse(t, AnnotationDomain, s, ParseDomain, Domain.Format, Domain.Validate)
	})
}

func FuzzParseStatus(f *testing.F) {
	for _, s := range []string{"Unschedulable: no leaf can hold 5 pods", "WaitingForPods: 1 of 4", "x: y", "A: "} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		fuzzParse(t, AnnotationStatus, s, ParseStatus, Status.Format, Status.Validate)
	})
}

func FuzzParseRelease(f *testing.F) {
	for _, s := range []string{"2;NodeNotReady", "1;BindTimeout", "01;A", "9999999999;A"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		fuzzParse(t, AnnotationReleased, s, ParseRelease, Release.Format, Release.Validate)
	})
}

func reservationErr(in, problem string) *ValueError {
	return &ValueError{Key: AnnotationReservation, Value: in, Problem: problem, Want: reservationForm}
}

func TestParseReservation(t *testing.T) {
	until := time.Date(2026, 11, 26, 10, 5, 0, 0, time.UTC)
	testParse(t, ParseReservation, Reservation.Format, map[string]parseCase[Reservation]{
		"leaf": {in: "2026-11-26T10:05:00Z;leaf:leaf-2;n1,n2",
			want: Reservation{Until: until, Domain: Domain{Level: LevelLeaf, Names: []string{"leaf-2"}}, Nodes: []string{"n1", "n2"}}},
		"node": {in: "2026-11-26T10:05:00Z;node:n1;n1",
			want: Reservation{Until: until, Domain: Domain{Level: LevelNode, Names: []string{"n1"}}, Nodes: []string{"n1"}}},
		"two parts":  {in: "2026-11-26T10:05:00Z;leaf:leaf-2", wantErr: reservationErr("2026-11-26T10:05:00Z;leaf:leaf-2", `has 2 parts separated by ";", not 3`)},
		"local time": {in: "2026-11-26T11:05:00+01:00;leaf:leaf-2;n1", wantErr: reservationErr("2026-11-26T11:05:00+01:00;leaf:leaf-2;n1", `has the time "2026-11-26T11:05:00+01:00", not an RFC 3339 time in UTC`)},
		"no time":    {in: ";leaf:leaf-2;n1", wantErr: reservationErr(";leaf:leaf-2;n1", `has the time "", not an RFC 3339 time in UTC`)},
		"bad domain": {in: "2026-11-26T10:05:00Z;shelf:a;n1", wantErr: reservationErr("2026-11-26T10:05:00Z;shelf:a;n1", `has the domain "shelf:a", which is not one`)},
		"no nodes":   {in: "2026-11-26T10:05:00Z;leaf:leaf-2;", wantErr: reservationErr("2026-11-26T10:05:00Z;leaf:leaf-2;", "names no node")},
		"bad node":   {in: "2026-11-26T10:05:00Z;leaf:leaf-2;N1", detail: true, wantErr: reservationErr("2026-11-26T10:05:00Z;leaf:leaf-2;N1", `has "N1" among its nodes, which is not a node name`)},
	})
}

func TestReservationActive(t *testing.T) {
	r := Reservation{Until: time.Date(2026, 11, 26, 10, 5, 0, 0, time.UTC)}
	if !r.Active(r.Until.Add(-time.Second)) || r.Active(r.Until) {
		t.Errorf("Active: want true a second before Until and false at Until")
	}
}

func FuzzParseReservation(f *testing.F) {
	for _, s := range []string{"2026-11-26T10:05:00Z;leaf:leaf-2;n1,n2", "2026-11-26T10:05:00Z;cluster:;a", ";;", "x;y;z"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		fuzzParse(t, AnnotationReservation, in, ParseReservation, Reservation.Format, Reservation.Validate)
	})
}
