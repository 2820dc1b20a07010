package v1alpha1

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParse(t *testing.T) {
	tests := map[string]struct {
		in      map[string]string
		want    Request
		wantErr []string
	}{
		"defaults": {in: map[string]string{AnnotationPlacement: ""}, want: Request{Placement: "auto", Strategy: "balanced"}},
		"full": {in: map[string]string{AnnotationPlacement: "same-leaf", AnnotationStrategy: "distributed", AnnotationPreferredDomain: "leaf-3",
			AnnotationPreferredRequired: "true", AnnotationGroup: "ring", AnnotationGroupSize: "8"},
			want: Request{Placement: "same-leaf", Strategy: "distributed", PreferredDomain: "leaf-3", PreferredRequired: true, Group: "ring", GroupSize: 8}},
		"bad placement":      {in: map[string]string{AnnotationPlacement: "same-rack"}, wantErr: []string{"placement: \"same-rack\" is not one of auto, same-leaf"}},
		"bad strategy":       {in: map[string]string{AnnotationStrategy: "packed"}, wantErr: []string{"strategy: \"packed\""}},
		"required w/o name":  {in: map[string]string{AnnotationPreferredRequired: "true"}, wantErr: []string{"needs gputopo.dev/preferred-domain"}},
		"required not bool":  {in: map[string]string{AnnotationPreferredRequired: "yes"}, wantErr: []string{"must be \"true\" or \"false\""}},
		"bad domain":         {in: map[string]string{AnnotationPreferredDomain: "leaf 3"}, wantErr: []string{"preferred-domain: \"leaf 3\""}},
		"group without size": {in: map[string]string{AnnotationGroup: "g"}, wantErr: []string{"group needs gputopo.dev/group-size"}},
		"size without group": {in: map[string]string{AnnotationGroupSize: "2"}, wantErr: []string{"group-size needs gputopo.dev/group"}},
		"size not a number":  {in: map[string]string{AnnotationGroup: "g", AnnotationGroupSize: "two"}, wantErr: []string{"whole number from 1 to 4096"}},
		"two problems": {in: map[string]string{AnnotationPlacement: "x", AnnotationStrategy: "y"},
			wantErr: []string{"placement: \"x\"", "strategy: \"y\""}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := Parse(tc.in)
			if len(tc.wantErr) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(tc.want, got); diff != "" {
					t.Errorf("(-want +got):\n%s", diff)
				}
				return
			}
			if err == nil {
				t.Fatalf("want errors %q", tc.wantErr)
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func FuzzParse(f *testing.F) {
	f.Add("auto", "leaf-1", "true", "balanced", "g", "3")
	f.Fuzz(func(t *testing.T, p, d, req, s, g, size string) {
		r, err := Parse(map[string]string{AnnotationPlacement: p, AnnotationPreferredDomain: d, AnnotationPreferredRequired: req,
			AnnotationStrategy: s, AnnotationGroup: g, AnnotationGroupSize: size})
		if err != nil {
			return
		}
		if !slices.Contains(Placements, r.Placement) || !slices.Contains(Strategies, r.Strategy) || r.GroupSize < 1 {
			t.Fatalf("accepted invalid request %+v", r)
		}
	})
}
