//! The GitHub adapter against the fake GitHub of the test tree (REST API 2022-11-28, on
//! loopback): what it sends, and how each documented answer maps to `PlatformError`.

use std::path::{Path, PathBuf};

use grove_core::platform::{
    GitPlatformProvider, NewPullRequest, PlatformError, PlatformRepo, PullRequestState,
};
use grove_core::ports::GitToken;
use grove_e2e::fake_github::{Failure, FakeGitHub};
use grove_e2e::git;
use grove_github::{GitHubConfig, GitHubProvider};

const TOKEN: &str = "ghp_fake_token_0123456789";

/// A bare repository with `main` and a branch `feature` one commit ahead.
fn bare_repo(dir: &Path) -> PathBuf {
    let work = dir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    git(&work, &["init", "-q", "-b", "main"]);
    std::fs::write(work.join("README.md"), "hello\n").unwrap();
    git(&work, &["add", "-A"]);
    git(&work, &["commit", "-q", "-m", "initial"]);
    git(&work, &["checkout", "-q", "-b", "feature"]);
    std::fs::write(work.join("new.txt"), "new\n").unwrap();
    git(&work, &["add", "-A"]);
    git(&work, &["commit", "-q", "-m", "feature"]);
    git(dir, &["clone", "-q", "--bare", "work", "octo.git"]);
    dir.join("octo.git")
}

struct Setup {
    _dir: tempfile::TempDir,
    fake: FakeGitHub,
    provider: GitHubProvider,
    repo: PlatformRepo,
}

async fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let bare = bare_repo(dir.path());
    let fake = FakeGitHub::start(TOKEN).await;
    fake.add_repo("octo/hello", &bare);
    let provider = GitHubProvider::new(GitHubConfig::new(&fake.api_url(), None).unwrap()).unwrap();
    let repo = provider.locate(&fake.repo_url("octo/hello")).unwrap();
    Setup {
        _dir: dir,
        fake,
        provider,
        repo,
    }
}

fn new_pr() -> NewPullRequest {
    NewPullRequest {
        head: "feature".into(),
        base: "main".into(),
        title: "Add new.txt".into(),
        body: Some("Adds a file.".into()),
        draft: true,
    }
}

fn token() -> GitToken {
    GitToken::new(TOKEN.into())
}

#[tokio::test]
async fn a_pull_request_is_created_read_and_commented_with_the_documented_headers() {
    let s = setup().await;
    assert_eq!(s.repo.full_name(), "octo/hello");
    let pr = s
        .provider
        .create_pull_request(&s.repo, &new_pr(), &token())
        .await
        .unwrap();
    assert_eq!(pr.number, 1);
    assert_eq!(pr.state, PullRequestState::Open);
    assert_eq!((pr.head.as_str(), pr.base.as_str()), ("feature", "main"));
    assert!(pr.draft && !pr.merged);
    assert_eq!(pr.url, format!("{}/octo/hello/pull/1", s.fake.web_origin()));

    let read = s.provider.get_pull_request(&s.repo, 1, None).await.unwrap();
    assert_eq!(read, pr);

    let comment = s
        .provider
        .comment_pull_request(&s.repo, 1, "Looks good.", &token())
        .await
        .unwrap();
    assert_eq!(comment.number, 1);
    assert!(comment
        .url
        .ends_with(&format!("#issuecomment-{}", comment.comment_id)));
    assert_eq!(s.fake.comments()[0]["body"], "Looks good.");

    let requests = s.fake.requests();
    assert_eq!(requests.len(), 3);
    let create = &requests[0];
    assert_eq!(
        (create.method.as_str(), create.path.as_str()),
        ("POST", "/repos/octo/hello/pulls")
    );
    assert_eq!(
        create.authorization.as_deref(),
        Some(&*format!("Bearer {TOKEN}"))
    );
    assert_eq!(
        create.accept.as_deref(),
        Some("application/vnd.github+json")
    );
    assert_eq!(create.api_version.as_deref(), Some("2022-11-28"));
    assert!(create.user_agent.as_deref().unwrap().starts_with("grove/"));
    assert_eq!(create.body["head"], "feature");
    assert_eq!(create.body["base"], "main");
    assert_eq!(create.body["title"], "Add new.txt");
    assert_eq!(create.body["draft"], true);
    // The read was made without a token: none was given.
    assert_eq!(requests[1].authorization, None);
    assert_eq!(requests[2].path, "/repos/octo/hello/issues/1/comments");
}

#[tokio::test]
async fn a_wrong_token_is_unauthorized_and_is_not_in_the_error() {
    let s = setup().await;
    let wrong = GitToken::new("ghp_wrong_secret_value".into());
    let err = s
        .provider
        .create_pull_request(&s.repo, &new_pr(), &wrong)
        .await
        .unwrap_err();
    assert!(matches!(err, PlatformError::Unauthorized(_)), "{err:?}");
    assert!(err.to_string().contains("Bad credentials"), "{err}");
    assert!(!format!("{err} {err:?}").contains("ghp_wrong_secret_value"));
    assert!(s.fake.pulls("octo/hello").is_empty());
}

#[tokio::test]
async fn an_unknown_repository_or_pull_request_is_not_found() {
    let s = setup().await;
    let missing = PlatformRepo {
        owner: "octo".into(),
        name: "absent".into(),
    };
    let err = s
        .provider
        .create_pull_request(&missing, &new_pr(), &token())
        .await
        .unwrap_err();
    assert!(matches!(err, PlatformError::NotFound(_)), "{err:?}");
    let err = s
        .provider
        .get_pull_request(&s.repo, 42, Some(&token()))
        .await
        .unwrap_err();
    assert!(matches!(err, PlatformError::NotFound(_)), "{err:?}");
    let err = s
        .provider
        .comment_pull_request(&s.repo, 42, "hi", &token())
        .await
        .unwrap_err();
    assert!(matches!(err, PlatformError::NotFound(_)), "{err:?}");
}

#[tokio::test]
async fn a_second_pull_request_for_the_same_head_is_a_validation_error_with_githubs_message() {
    let s = setup().await;
    s.provider
        .create_pull_request(&s.repo, &new_pr(), &token())
        .await
        .unwrap();
    let err = s
        .provider
        .create_pull_request(&s.repo, &new_pr(), &token())
        .await
        .unwrap_err();
    match &err {
        PlatformError::Validation { message, errors } => {
            assert_eq!(message, "Validation Failed");
            assert_eq!(
                errors,
                &vec!["A pull request already exists for octo:feature.".to_string()]
            );
        }
        other => panic!("{other:?}"),
    }
    // A head that is not a branch there is refused by field.
    let err = s
        .provider
        .create_pull_request(
            &s.repo,
            &NewPullRequest {
                head: "not-pushed".into(),
                ..new_pr()
            },
            &token(),
        )
        .await
        .unwrap_err();
    assert_eq!(
        err,
        PlatformError::Validation {
            message: "Validation Failed".into(),
            errors: vec!["PullRequest.head invalid".into()]
        }
    );
    assert_eq!(s.fake.pulls("octo/hello").len(), 1);
}

#[tokio::test]
async fn primary_and_secondary_rate_limits_say_how_long_to_wait() {
    let s = setup().await;
    s.fake.fail_next(Failure::PrimaryRateLimit { reset_in: 90 });
    s.fake
        .fail_next(Failure::SecondaryRateLimit { retry_after: 60 });
    match s
        .provider
        .create_pull_request(&s.repo, &new_pr(), &token())
        .await
    {
        Err(PlatformError::RateLimited {
            retry_after_secs: Some(secs),
            message,
        }) => {
            assert!((80..=90).contains(&secs), "{secs}");
            assert!(message.contains("API rate limit exceeded"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    match s.provider.get_pull_request(&s.repo, 1, None).await {
        Err(PlatformError::RateLimited {
            retry_after_secs: Some(60),
            message,
        }) => assert!(message.contains("secondary rate limit"), "{message}"),
        other => panic!("{other:?}"),
    }
    // Nothing was created while limited; the next request goes through.
    assert!(s.fake.pulls("octo/hello").is_empty());
    s.provider
        .create_pull_request(&s.repo, &new_pr(), &token())
        .await
        .unwrap();
}

#[tokio::test]
async fn a_server_error_or_an_unreachable_api_is_unavailable() {
    let s = setup().await;
    s.fake.fail_next(Failure::BadGateway);
    let err = s
        .provider
        .get_pull_request(&s.repo, 1, None)
        .await
        .unwrap_err();
    assert!(matches!(err, PlatformError::Unavailable(_)), "{err:?}");
    // A port nothing listens on (the fake's, after it stopped).
    let api = s.fake.api_url();
    drop(s.fake);
    let gone = GitHubProvider::new(GitHubConfig::new(&api, None).unwrap()).unwrap();
    let err = gone
        .create_pull_request(&s.repo, &new_pr(), &token())
        .await
        .unwrap_err();
    assert!(matches!(err, PlatformError::Unavailable(_)), "{err:?}");
    assert!(!err.to_string().contains(TOKEN));
}

#[tokio::test]
async fn only_repositories_on_the_configured_origin_are_located() {
    let s = setup().await;
    for bad in [
        "https://github.com/octo/hello.git".to_string(),
        "file:///srv/octo/hello.git".to_string(),
        format!("{}/octo/hello/extra", s.fake.web_origin()),
    ] {
        assert!(
            matches!(
                s.provider.locate(&bad),
                Err(PlatformError::NotOnPlatform(_))
            ),
            "{bad}"
        );
    }
    let github = GitHubProvider::new(GitHubConfig::github_com()).unwrap();
    assert_eq!(
        github
            .locate("https://github.com/octo/hello.git")
            .unwrap()
            .full_name(),
        "octo/hello"
    );
}
