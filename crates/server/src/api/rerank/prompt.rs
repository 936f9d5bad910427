//! The reranker's prompt (Qwen3-Reranker's): a system turn that asks for `yes` or `no`,
//! the instruction, query and document in the user turn, and an assistant turn opened
//! after an empty thinking block, so the next token is the answer.

/// The instruction when the request gives none (Qwen3-Reranker's default).
pub const DEFAULT_INSTRUCTION: &str =
    "Given a web search query, retrieve relevant passages that answer the query";

const SYSTEM: &str = "Judge whether the Document meets the requirements based on the Query \
                      and the Instruct provided. Note that the answer can only be \"yes\" \
                      or \"no\".";

/// The prompt that scores `document` for `query`.
pub fn rerank_prompt(instruction: &str, query: &str, document: &str) -> String {
    format!(
        "<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n<Instruct>: {instruction}\n\
         <Query>: {query}\n<Document>: {document}<|im_end|>\n<|im_start|>assistant\n\
         <think>\n\n</think>\n\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prompt_is_qwen3_rerankers() {
        let p = rerank_prompt("I", "Q", "D");
        assert!(p.starts_with("<|im_start|>system\nJudge whether the Document"));
        assert!(p.contains("can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n"));
        assert!(p.contains("<Instruct>: I\n<Query>: Q\n<Document>: D<|im_end|>\n"));
        assert!(p.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
    }
}
