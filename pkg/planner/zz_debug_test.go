package planner_test
import ("context";"fmt";"strings";"testing"
"github.com/gputopo/gputopo/pkg/planner")
func TestZZDebug(t *testing.T){
 c := fourLeaves().Obj(t)
 for _, tc := range []struct{a *usage; j planner.Job}{
  {allocated().GPUs("l1n0",0), makeJob(t,"j").Pods(8,"gpu-8-node").Obj()},
  {allocated().Nodes("l2n0", "l2n1", "l3n0", "l3n1", "l3n2"), makeJob(t,"j").Pods(2,"gpu-8-node").Prefer("leaf-3",false).Obj()},
  {allocated().Nodes("l0n0", "l0n1", "l1n0", "l1n1", "l2n0", "l3n0", "l3n1"), makeJob(t,"j").Pods(4,"gpu-8-node").Obj()},
  {allocated().Nodes("l0n0", "l0n1", "l1n0", "l1n1", "l2n0", "l3n0", "l3n1"), makeJob(t,"j").Pods(12,"gpu-8-node").Obj()},
  {allocated(), makeJob(t,"j").Pods(3,"gpu-4-nvlink").Pods(2,"gpu-1").Strategy(planner.StrategyDistributed).Obj()},
 }{
  p, err := newPlanner(t).Plan(context.Background(), planner.NewSnapshot(c, tc.a.Obj()), nil, tc.j)
  if err != nil { fmt.Println("ERR:", err); if u, ok := err.(*planner.Unschedulable); ok {fmt.Println("  "+strings.Join(u.Details,"\n  "))}; continue }
  fmt.Println(p.Domain, p.Assignments, p.Fallback); fmt.Println("  "+strings.Join(p.Reasons, "\n  "))
 }
}
