// The API's answers, as far as the dashboard reads them (app/*/models.py).

export interface Page<T> {
  items: T[];
  total: number;
  offset: number;
  limit: number;
}

export interface Cluster {
  name: string;
  scheduler: string;
  description: string;
  mode: string;
  policy: string;
  connector_status: string;
  node_count: number;
  gpu_count: number;
  // Where it is ({"region": "eu-west"}): a team's cluster_selector matches these.
  labels: Record<string, string>;
  federation_group: string | null;
}

export interface GpuFigures {
  gpus: number;
  gpus_down: number;
  allocated: number;
  free: number;
  idle_allocated: number;
  unmeasured_allocated: number;
  pending_jobs: number;
  pending_gpus: number;
  awaiting_approval_actions: number;
  awaiting_approval_plans: number;
}

export interface ClusterFigures extends GpuFigures {
  cluster: string;
  mode: string;
}

export interface FleetOverview {
  at: string;
  busy_threshold: number;
  recent_s: number;
  clusters: ClusterFigures[];
  fleet: GpuFigures;
}

export interface UtilizationPoint {
  start: string;
  allocated_gpus: number;
  allocated_share: number;
  measured_util: number | null;
}

export interface UtilizationSeries {
  key: string;
  capacity_gpus: number;
  points: UtilizationPoint[];
}

export interface UtilizationSummary {
  group_by: "cluster" | "gpu_model" | "team";
  bucket_s: number;
  since: string;
  until: string;
  series: UtilizationSeries[];
}

export interface Node {
  name: string;
  gpu_model: string | null;
  gpu_count: number;
  gpus_allocated: number;
  state: string;
}

export interface Allocation {
  node: string;
  gpu_indices: number[];
  gpu_count: number;
}

export interface Job {
  id: number;
  external_id: string;
  cluster: string;
  team: string;
  queue: string;
  kind: string;
  priority: number;
  sla_class: string;
  shape: string;
  replicas: number;
  gpus_requested: number;
  state: string;
  // The scheduler's own word on the job (Slurm's pending reason, a pod's condition).
  reason: string;
  submit_time: string | null;
  start_time: string | null;
  end_time: string | null;
  // How long after it starts its scheduler ends it (Slurm's TimeLimit, a Job's
  // activeDeadlineSeconds); null or absent: none, or the scheduler does not say.
  time_limit_s?: number | null;
  allocations: Allocation[];
  // The clusters of its federation group it may run in (its own rule; its team's is the
  // SLA policy's); null or absent: no rule of its own.
  residency?: Residency | null;
  // Its own speed on GPU models (model → speed, the catalogue's scale); empty or absent:
  // it runs at its models' speeds.
  speeds?: Record<string, number>;
}

export interface Residency {
  cluster_selector: Record<string, string>;
  allowed_clusters: string[] | null;
}

export interface Action {
  id: number;
  plan_id: number | null;
  cluster: string;
  // A federated move's destination (the cluster the job goes to); null otherwise.
  target_cluster: string | null;
  kind: string;
  // The job's id (GET /jobs/{id}, the job page); absent from older servers.
  job_id?: number | null;
  job_external_id: string | null;
  source_node: string | null;
  target_node: string | null;
  target_replicas: number | null;
  state: string;
  depends_on: number[];
  reason: string;
  error: string | null;
}

/** An action as GET /actions/{id} gives it, with what the job page shows besides. */
export interface ActionDetail extends Action {
  source_placement: Record<string, number>;
  target_placement: Record<string, number>;
  attempts: number;
  created_at: string;
  updated_at: string;
  decided_by: string | null;
  decided_at: string | null;
  finished_at: string | null;
}

/** One step of an action's saga (GET /actions/{id}/steps). */
export interface ActionStep {
  seq: number;
  phase: string;
  name: string;
  queue: string;
  state: string;
  attempts: number;
  error: string | null;
  sent_at: string | null;
  finished_at: string | null;
}

export interface Plan {
  id: number;
  cluster: string | null;
  created_at: string;
  policy: string;
  engine: string;
  status: string;
  state: string;
  state_reason: string | null;
  objective: number | null;
  gap: number | null;
  decisions: PlanDecision[];
}

/** One line of a plan (app.shaping.cycle._decisions): an action, or "wait" and why. */
export interface PlanDecision {
  job: string;
  action: string;
  reason: string;
  message?: string;
  // The nodes a move leaves (app.shaping.cycle: comma-separated); absent for a wait.
  from?: string | null;
  to?: string | null;
}

/** GET /plans/decisions: the cluster's latest plan's decisions for the jobs asked about. */
export interface JobDecisions {
  cluster: string;
  plan_id: number | null;
  created_at: string | null;
  decisions: PlanDecision[];
}

/** GET /plans/decisions/history: one plan's decision about one job. */
export interface PlanDecisionOnJob {
  plan_id: number;
  created_at: string;
  mode: string;
  plan_state: string;
  decision: PlanDecision;
}

export interface Policy {
  name: string;
  version: number;
  created_at: string;
  created_by: string;
  comment: string;
  // A deletion is a version too (app.policies.models.SlaPolicy).
  deleted: boolean;
  spec: unknown;
}

export interface SimulationListing {
  name: string;
  scenario: string;
  seed: number | null;
  policies: string[];
}

export interface SimulationRun {
  metrics: Record<string, number>;
  t_h: number[];
  utilization: number[];
}

export interface SimulationResult {
  runs: Record<string, SimulationRun>;
}

export interface CauseHours {
  cause: string;
  gpu_hours: number;
  share_of_idle: number;
}

export interface Diagnosis {
  since: string;
  until: string;
  capacity_gpu_hours: number;
  busy_gpu_hours: number;
  idle_gpu_hours: number;
  causes: CauseHours[];
  by_gpu_model: { key: string | null; cause: string; gpu_hours: number }[];
}

// Federation (app/federation/models.py, planning.py, moves.py).
export interface FederationGroup {
  name: string;
  description: string;
  clusters: string[];
  inter_cluster_bandwidth_mib_per_s: number;
  inter_cluster_overhead_s: number;
  inter_cluster_egress_gpu_s_per_gib: number;
}

export interface FederationFigures {
  pending_started: number;
  objective: number;
}

export interface FederatedMove {
  job: string;
  from_cluster: string;
  to_cluster: string;
  gpus: number;
  nodes: string[];
}

export interface FederationWhatIf {
  group: string;
  clusters: string[];
  planned_at: string;
  policy: string;
  pending_jobs: number;
  movable_jobs: number;
  alone: FederationFigures;
  federated: FederationFigures;
  moves: FederatedMove[];
  // Newer servers say what the plan priced a start away from home at, and why jobs stay.
  link?: { bandwidth_mib_per_s: number; measured_transfers: number };
  stays_home?: number;
  stays_home_examples?: { job: string; cluster: string; why: string }[];
  dispatch: string;
}

export interface MovesProposed {
  group: string;
  proposed: number[];
  approved: number[];
  kept: number;
  superseded: number;
  skipped: Record<string, string>;
}

// Forecast accuracy (app/forecasts/models.py): errors in replicas, fractions as 0..1.
export interface ServiceAccuracy {
  cluster: string;
  service: string;
  hours_scored: number;
  mae_replicas: number;
  naive_mae_replicas: number;
  // 1 − MAE / naive MAE; null when the naive forecast was exact every hour.
  skill: number | null;
  bias_replicas: number;
  coverage: number;
  target_quantile: number;
  methods: Record<string, number>;
}

export interface DurationAccuracy {
  cluster: string;
  jobs_scored: number;
  mae_hours: number;
  naive_mae_hours: number;
  bias_hours: number;
  median_abs_pct_error: number | null;
  naive_median_abs_pct_error: number | null;
  median_ratio: number | null;
}

// One service's forecasts made lead_h hours ahead (the solver's look-ahead steps).
export interface LeadAccuracy {
  cluster: string;
  service: string | null;
  lead_h: number;
  hours_scored: number;
  mae_replicas: number;
  naive_mae_replicas: number;
  skill: number | null;
  bias_replicas: number;
  coverage: number;
  target_quantile: number;
}

export interface ForecastAccuracy {
  since: string;
  until: string;
  window_h: number;
  services: ServiceAccuracy[];
  by_lead: LeadAccuracy[];
  durations: DurationAccuracy[];
}

/** A plan as GET /plans/{id} gives it, with what the plan page shows besides. */
export interface PlanDetail extends Plan {
  mode: string;
  best_bound: number | null;
  wall_time_s: number;
  summary: Record<string, unknown>;
  checked_at: string | null;
  decided_by: string | null;
  decided_at: string | null;
}

/** A job's GPUs on a node, before or after a plan (GET /plans/{id}/placement). */
export interface PlacedJob {
  job: string;
  job_id: number | null;
  gpus: number;
  // Which GPUs, where known; empty where the scheduler only counts them.
  gpu_indices: number[];
}

export interface NodePlacement {
  node: string;
  gpu_model: string | null;
  gpus: number | null;
  before: PlacedJob[];
  after: PlacedJob[];
}

export interface PlanPlacement {
  plan_id: number;
  cluster: string | null;
  // False: rebuilt from the plan's actions, the jobs they leave alone are not shown.
  complete: boolean;
  nodes: NodePlacement[];
}

/** A saga step of one of a plan's actions (GET /plans/{id}/steps). */
export interface PlanStep extends ActionStep {
  action_id: number;
}

/** GET /nodes/map: one cluster's nodes, GPU by GPU, and its latest open plan's moves. */
export interface ClusterMap {
  cluster: string;
  measured_since: string;
  nodes: MapNode[];
  jobs: MapJob[];
  plan: { id: number; state: string; created_at: string } | null;
  moves: PlannedMove[];
}

export interface MapNode {
  name: string;
  gpu_model: string | null;
  gpu_memory_gib: number | null;
  state: string;
  // By GPU index: the holding job's place in ClusterMap.jobs (null: free), and the latest
  // measured busy fraction and memory (null: not measured).
  holders: (number | null)[];
  util: (number | null)[];
  mem_used_gib: (number | null)[];
}

export interface MapJob {
  id: number;
  external_id: string;
  team: string;
  sla_class: string;
}

export interface MapCells {
  node: string;
  gpus: number;
  gpu_indices: number[];
  // False: the first free GPUs stand for a count the plan did not pin to devices.
  exact: boolean;
}

export interface PlannedMove {
  action_id: number;
  kind: string;
  state: string;
  job: string | null;
  job_id: number | null;
  target_cluster: string | null;
  source: MapCells[];
  target: MapCells[];
}

export interface WhatIfOptions {
  scenarios: string[];
  policies: string[];
  trace_kinds: string[];
  upload_max_mb: number;
}

export interface WhatIfRun {
  id: string;
  scenario: string;
  policies: string[];
  seed: number | null;
  state: "queued" | "running" | "done" | "failed";
  policies_done: number;
  current_policy: string | null;
  progress: number;
  error: string | null;
  // An uploaded trace's file name as sent; null for a built-in scenario.
  trace: string | null;
  result: string | null;
}
