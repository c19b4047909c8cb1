//! Scenario `merge_back_kill`: a task with thousands of changed files is merged back
//! into an edit workspace while the worker is SIGKILLed at a random moment. Once a
//! fresh worker has touched the workspace (it settles a leftover journal before any
//! command runs), the edit workspace must be entirely as before the merge-back or
//! entirely as after it — tree, index, HEAD and refs compared against both snapshots;
//! anything else is a half-written workspace, counted as lost.

use std::time::Duration;

use grove_e2e::{acquire_args, text};

use crate::saved_work::workspace_view;
use crate::{env_or_skip, replay_ok, scale, Figures, Fleet, Rng};

const TRIALS: u64 = 4;
/// Changed files per task at scale 1.
const FILES: u64 = 3000;

#[tokio::test(flavor = "multi_thread")]
async fn merge_back_kill_leaves_the_edit_workspace_all_before_or_all_after() {
    let env = env_or_skip!("merge_back_kill_leaves_the_edit_workspace_all_before_or_all_after");
    let mut rng = Rng::new("merge_back_kill");
    let url = env.fixture_repo(
        "fixture",
        &[
            ("README.md", "fixture\n"),
            ("src/a.txt", "a\n"),
            ("old.txt", "old\n"),
        ],
    );
    let mut fleet = Fleet::new(&env, &[("GROVE_WORKER_LOST_AFTER", "3")], 2);
    fleet.spawn().await;
    let mut figures = Figures::default();
    let (mut before_n, mut after_n) = (0, 0);
    let files = FILES * scale();
    for n in 0..TRIALS * scale() {
        let edit = env
            .grove_json(&acquire_args(
                &url,
                "edit",
                &["--conversation", &format!("c{n}")],
            ))
            .await;
        let task = env
            .grove_json(&acquire_args(&url, "task", &["--task", &format!("t{n}")]))
            .await;
        let (edit_id, task_id) = (
            edit["id"].as_str().unwrap().to_string(),
            task["id"].as_str().unwrap().to_string(),
        );
        let edit_dir = std::path::PathBuf::from(edit["local_path"].as_str().unwrap());
        let task_dir = std::path::PathBuf::from(task["local_path"].as_str().unwrap());
        let script = format!(
            "set -e
            mkdir -p big && i=0; while [ $i -lt {files} ]; do echo $i > big/f$i; i=$((i+1)); done
            echo changed > README.md && rm old.txt && printf '#!/bin/sh\\n' > run.sh && chmod +x run.sh
            git add -A && git commit -qm 'task work'"
        );
        let out = env
            .grove(&["exec", &task_id, "--", "sh", "-c", &script])
            .await;
        assert!(out.status.success(), "{:?}", text(&out));
        let out = env
            .grove(&[
                "exec",
                &edit_id,
                "--",
                "sh",
                "-c",
                "echo mine > untracked.txt",
            ])
            .await;
        assert!(out.status.success(), "{:?}", text(&out));
        let before = workspace_view(&edit_dir);
        // What a completed fast-forward looks like: the task's tree and HEAD, the edit
        // branch at the task's head, the untracked file still there.
        let task_head = grove_e2e::git(&task_dir, &["rev-parse", "HEAD"]);

        let merge = env
            .command(&[
                "workspace",
                "merge-back",
                &edit_id,
                "--task",
                &task_id,
                "--strategy",
                "merge",
            ])
            .output();
        let merge = tokio::spawn(merge);
        tokio::time::sleep(Duration::from_millis(rng.range(100, 2500))).await;
        fleet.kill9(0).await;
        figures.injected += 1;
        fleet.spawn().await;
        let _ = merge.await;
        // Any command on the workspace settles a leftover journal first.
        let out = env.grove(&["exec", &edit_id, "--", "true"]).await;
        assert!(out.status.success(), "{:?}", text(&out));
        figures.trials += 1;
        let now = workspace_view(&edit_dir);
        if now == before {
            before_n += 1;
            continue;
        }
        let head = grove_e2e::git(&edit_dir, &["rev-parse", "HEAD"]);
        let index = grove_e2e::git(&edit_dir, &["ls-files", "-s"]);
        let task_index = grove_e2e::git(&task_dir, &["ls-files", "-s"]);
        let status = grove_e2e::git(&edit_dir, &["status", "--porcelain", "-uall"]);
        let whole_after = head == task_head && index == task_index && status == "?? untracked.txt";
        if whole_after {
            after_n += 1;
        } else {
            figures.lost += 1;
            let diffs: Vec<&String> = before
                .keys()
                .filter(|k| before.get(*k) != now.get(*k))
                .take(10)
                .collect();
            figures.note(format!(
                "edit workspace {edit_id} half-written: head {head} (task {task_head}), status {:?}, differs from before in {diffs:?}",
                status.lines().take(5).collect::<Vec<_>>()
            ));
        }
    }
    eprintln!("merge_back_kill: {before_n} rolled back or never started, {after_n} complete");
    replay_ok(&env, &mut figures).await;
    figures.finish("merge_back_kill");
}
