package controller

import (
	"strings"
	"testing"
	"time"
)

func TestOptionsValidate(t *testing.T) {
	for name, tc := range map[string]struct {
		change func(*Options)
		want   []string
	}{
		"defaults": {change: func(*Options) {}},
		"everything wrong at once": {
			change: func(o *Options) {
				o.RetryInterval, o.KubeAPIQPS, o.LeaderElectionIdentity = -time.Second, 0, ""
				o.BindTimeout, o.SettleDelay, o.ReserveAfter = 0, -time.Millisecond, 0
				o.LabelMapping.ConfigMap = "no-namespace"
				o.ConcurrentGroupWrites = -1
			},
			want: []string{"--retry-interval must be positive", "--bind-timeout must be positive", "--settle-delay must not be negative",
				"--reserve-after must be positive",
				"--kube-api-qps and --kube-api-burst must be positive",
				"--concurrent-group-writes must not be negative",
				"--leader-elect needs", "--label-mapping=\"no-namespace\": want NAMESPACE/NAME"},
		},
		"no identity without leader election": {change: func(o *Options) { o.LeaderElect, o.LeaderElectionIdentity = false, "" }},
	} {
		t.Run(name, func(t *testing.T) {
			o := NewOptions()
			o.LeaderElectionIdentity = "me"
			tc.change(o)
			err := o.Validate()
			if (err != nil) != (len(tc.want) > 0) {
				t.Fatalf("Validate() = %v, want errors %q", err, tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}
