"""The LLM path's prompts: the paper's templates of appendix A.7 (Figs. 9-12), as written there.

The paper leaves some slots to its harness; ours: `{action_format}` is the environment's own instruction
(rules and reply format); `{initial_obs}` the task text of the start; `{history_text}` the exploration's
steps so far; the unguided ablation's guidance and the abstraction's `{output_format}` (the block its parser
reads, `llm.parse_abstraction`) are ours, and the abstraction prompt is followed by the interaction tuples it
asks the model to inspect.
"""

EXPLORATION_SYSTEM = """You are exploring based on specific guidance to help improve an AI agent's capabilities.
## Your Task:
1. Observe the current environment state and identify available actions
2. Analyze available actions and determine which ones will help with the exploration goal
3. Select a relevant action and execute it in the required format
4. Focus on thorough exploration of the targeted area
# Action Format:
{action_format}
## Instructions:
- Choose only one action at a time
- Carefully read the environment description and task instructions
- Ensure that the action is in the correct format
- Do not use undefined actions
- Always include a valid action and action tags in your reply
- First enter your reason, then enter your action"""

EXPLORATION_USER = """{exploration_guidance}
## Environment Description:
{initial_obs}
## Recent History:
{history_text}
Please select an appropriate action based on the exploration goal and current state."""

GUIDANCE = {
    "forgetting": """Exploration Goal: Reinforce Forgotten Skills
The agent previously succeeded but now FAILS on this type of task.
Your exploration should:
1. Practice the exact operations from the context below
2. Create variations with different parameters
3. Connect this skill to related operations
4. Build up from simple to complex usage
Context of forgetting:
{context}
Focus on thorough practice of these specific operations.""",
    "rare": """Exploration Goal: Explore Rare Scenarios
The agent encountered a RARE scenario that needs more exposure.
Your exploration should:
1. Explore variations of the scenario below
2. Try different parameter combinations
3. Test edge cases and boundary conditions
4. Collect diverse examples of this rare pattern
Context of rare event:
{context}
Try to discover and document various forms of this scenario.""",
    "boundary": """Exploration Goal: Explore Boundary Cases
The agent's performance is BORDERLINE (near success/failure threshold).
Your exploration should:
1. Explore boundary conditions for these operations
2. Try similar tasks with slight parameter variations
3. Focus on distinguishing factors between success and failure
4. Collect examples at various difficulty levels
Context of boundary case:
{context}
Focus on understanding what makes the difference between success and failure.""",
    "unguided": """Exploration Goal: Explore the Environment
Try the actions the environment offers and collect examples of tasks that can be completed in it.""",
}

REFLECTION = """You are an expert at analyzing trajectory-level failure and behavioral instability for an LLM agent.
Analyze the following feedback signal and trajectory evidence:
Feedback Signal:
- Signal: {signal}
Trajectory Evidence:
{trajectory_context}
Your goal is to extract a structured exploration context that captures:
1) A concise recap of this trajectory
2) Why failure or instability happened
3) Which patterns or behaviors should be re-explored
4) What mistakes should be explicitly avoided
Return a JSON object with this schema:
{{
"summary": "concise recap of the current trajectory evidence (task, key actions, and feedback outcome)",
"failure_cause": "1-3 sentence root cause of failure or instability",
"instability_pattern": "1-2 sentence pattern summary",
"focus_pattern": ["pattern or behavior to focus on", "..."],
"exploration_objectives": ["concrete exploration objective", "..."],
"do_not_repeat": ["common mistake to avoid", "..."]
}}
Rules:
- Ground every statement in the provided evidence.
- Keep the output concise and actionable.
- First produce `summary` from the trajectory evidence, then derive the other fields from that summary."""

ABSTRACTION = """You are a *Task Abstraction Expert*. Your specialty is to inspect an agent's interaction history and distill concrete, goal-oriented tasks from it.
======================== YOUR JOB ========================
1. Inspect the interaction tuples (history, action, observation).
2. Identify the specific goal or task the agent is attempting to achieve.
3. Abstract each goal into a clear, concise **task description**, a **query** (suitable for search or training), and the **minimal action sequence** that successfully completes the task.
===================== ABSTRACTION RULES ==================
- Focus on clear, goal-directed behaviour; ignore purely random exploration.
- Please include as many steps as possible in ActionSequence.
- Group similar behaviour patterns into the same task.
- Every task must have **at least one** action sequence that was executed successfully.
- Each task needs an explicit completion criterion.
- All actions listed in an action sequence must be valid and directly executable.
- Ensure all actions are combined into a minimum sequence from initial state to completion.
- The ActionSequence should have at least 3 steps.
======================== OUTPUT FORMAT ===================
For every task you identify, output exactly one block in the form below:
{output_format}
======================== INTERACTION TUPLES ===================
{tuples}"""

OUTPUT_FORMAT = """Description: <one sentence describing the task>
Query: <the task as a user would ask it>
ActionSequence:
1. <first action, exactly as executed>
2. <second action>
3. <third action>"""
