package command_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/spf13/pflag"

	"github.com/gputopo/gputopo/pkg/command"
)

type opts struct {
	node   string
	retry  time.Duration
	labels []string
}

// parse is command.Parse without the logging configuration, which a
// process may apply only once.
func parse(fs *pflag.FlagSet, args []string) error {
	fromEnv := command.EnvFallback(fs)
	fs.Int("v", 0, "a flag added after EnvFallback")
	if err := fs.Parse(args); err != nil {
		return err
	}
	return fromEnv()
}

func flags(o *opts) *pflag.FlagSet {
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	fs.StringVar(&o.node, "node-name", "", "node")
	fs.DurationVar(&o.retry, "retry-interval", time.Second, "retry")
	fs.StringSliceVar(&o.labels, "leaf-labels", []string{"a"}, "labels")
	return fs
}

func TestParseEnvFallback(t *testing.T) {
	for name, tc := range map[string]struct {
		env  map[string]string
		args []string
		want opts
	}{
		"defaults":                {want: opts{retry: time.Second, labels: []string{"a"}}},
		"environment":             {env: map[string]string{"NODE_NAME": "n1", "RETRY_INTERVAL": "5s", "LEAF_LABELS": "x,y"}, want: opts{node: "n1", retry: 5 * time.Second, labels: []string{"x", "y"}}},
		"command line wins":       {env: map[string]string{"NODE_NAME": "n1"}, args: []string{"--node-name=n2"}, want: opts{node: "n2", retry: time.Second, labels: []string{"a"}}},
		"empty variable is unset": {env: map[string]string{"NODE_NAME": ""}, want: opts{retry: time.Second, labels: []string{"a"}}},
	} {
		t.Run(name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			var o opts
			if err := parse(flags(&o), tc.args); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, o, cmp.AllowUnexported(opts{})); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseBadEnvNamesVariable(t *testing.T) {
	t.Setenv("RETRY_INTERVAL", "soon")
	var o opts
	err := parse(flags(&o), nil)
	if err == nil || !strings.Contains(err.Error(), `$RETRY_INTERVAL="soon" for --retry-interval`) {
		t.Errorf("err = %v, want one naming the variable and the flag", err)
	}
}

func TestUsageNamesVariable(t *testing.T) {
	var o opts
	fs := flags(&o)
	if err := parse(fs, nil); err != nil {
		t.Fatal(err)
	}
	usage := fs.FlagUsages()
	if !strings.Contains(usage, "[$NODE_NAME]") || strings.Contains(usage, "[$V]") {
		t.Errorf("usage must name the variables of the flags that were there before EnvFallback only:\n%s", usage)
	}
}
